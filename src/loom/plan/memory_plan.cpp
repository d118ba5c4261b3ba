#include "loom/plan/memory_plan.h"

#include <algorithm>

#include "loom/model/layer_spec.h"
#include "loom/optim/moment_arrays.h"
#include "loom/parallel/data/bf16_parameter_copy.h"
#include "loom/parallel/data/grad_buckets.h"
#include "loom/parallel/data/parameter_dtype.h"
#include "loom/plan/activation_memory.h"
#include "loom/plan/activation_pool.h"
#include "loom/plan/device_shapes.h"
#include "loom/plan/layer_widths.h"
#include "loom/plan/shape_group.h"

namespace loom::plan {

namespace {

// Parameters per unit (embeddings, each layer, head) in registration order, to size what ZeRO-3
// gathers and compact parameters widen one unit at a time.
std::vector<int64_t> unit_sizes(const std::vector<model::Parameter>& params) {
  auto unit_of = [](const std::string& name) -> std::string {
    const std::string layers = "model.layers.";
    if (name.rfind(layers, 0) == 0) return name.substr(0, name.find('.', layers.size()));
    return name.rfind("model.embed", 0) == 0 ? "embeddings" : "head";
  };
  std::vector<int64_t> sizes;
  std::string unit;
  for (const model::Parameter& p : params) {
    const std::string u = unit_of(p.name);
    if (sizes.empty() || u != unit) sizes.push_back(0);
    unit = u;
    sizes.back() += p.numel;
  }
  return sizes;
}

int64_t largest(const std::vector<int64_t>& sizes) { return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end()); }

// ZeRO-3 holds a unit's gathered parameters while the next one's gather is in flight (prefetch),
// and a unit's gradients while the previous one's reduce-scatter completes: two neighbours.
int64_t largest_neighbours(const std::vector<int64_t>& sizes) {
  int64_t best = largest(sizes);
  for (size_t u = 1; u < sizes.size(); ++u) best = std::max(best, sizes[u - 1] + sizes[u]);
  return best;
}

// Staging of the bucketed reductions (parallel/data/distributed_optimizer.cpp: two slots of the
// largest padded bucket plus a receive area, the buckets cut by the same make_buckets, so a
// parameter larger than parallel.bucket_mb, e.g. a vocabulary's embedding, sizes them) and
// ZeRO-3's reduce-scatter slots.
int64_t comm_buffer_bytes(const config::RunConfig& config, const std::vector<model::Parameter>& params, int64_t unit,
                          int dp, int zero) {
  if (zero == 0) return 0;
  const int64_t wire = config.precision.grad_reduce == config::GradReduce::Bf16 ? 2 : 4;
  if (zero == 3) {
    const int64_t shard = (unit + dp - 1) / dp;
    return 2 * (shard * dp + shard) * wire;
  }
  std::vector<parallel::ParamRange> ranges;
  int64_t offset = 0;
  for (const model::Parameter& p : params) {
    ranges.push_back({offset, p.numel});
    offset += p.numel;
  }
  const auto bucket_bytes = static_cast<int64_t>(config.parallel.bucket_mb * 1024.0 * 1024.0);
  const parallel::BucketLayout layout = parallel::make_buckets(ranges, bucket_bytes, dp);
  int64_t max_shard = 0, communicating = 0;
  for (const parallel::Bucket& b : layout.buckets) {
    max_shard = std::max(max_shard, b.shard_numel);
    communicating += b.numel > 0;
  }
  const int64_t slots = std::min<int64_t>(2, communicating);
  return slots * (dp + 1) * max_shard * wire;
}

// The model state (parameters, gradients, master weights, moments) of one parameter group and
// the buffers its data parallelism gathers into, over the `dp` ranks it is reduced over, at the
// run's ZeRO stage: the trainer runs that stage's synchronisation at one replica too (ZeRO 1-2
// with their master copy and staging, ZeRO-3 with its gathered units), and over a group of one
// rank (the experts' group over an expert-data-parallel size of 1).
struct GroupState {
  parallel::MemoryBytes state;
  int64_t gather_buffers = 0;
};

GroupState plan_group_state(const config::RunConfig& config, const std::vector<model::Parameter>& params, int dp) {
  GroupState m;
  int64_t parameter_count = 0;
  for (const model::Parameter& p : params) parameter_count += p.numel;
  const bool compact = parallel::parameter_dtype(config) != DType::F32;
  const int zero = config.parallel.zero;
  const std::vector<int64_t> units = unit_sizes(params);
  const int64_t unit = largest(units);
  parallel::MemoryModel model_state{parameter_count, dp, zero, compact ? 2 : 4, 4,
                                    comm_buffer_bytes(config, params, unit, dp, zero)};
  m.state = parallel::memory_per_rank(model_state);
  // ZeRO 1-2 keep an fp32 master copy of the owned shard even when the parameters are fp32
  // (distributed_optimizer.cpp); ZeRO-3's shard is its own master.
  if (!compact && (zero == 1 || zero == 2)) m.state.master_weights = 4 * ((parameter_count + dp - 1) / dp);
  // An optimizer offloaded to the host keeps its moments there, or their optim.offload_fraction
  // (optim/moment_arrays.h).
  const bool gpu = config.runtime.device == config::RuntimeDevice::Cuda;
  m.state.host_optimizer_moments = 8 * optim::offloaded_elements(config.optim, gpu, m.state.optimizer_moments / 8);
  m.state.optimizer_moments -= m.state.host_optimizer_moments;
  // ZeRO-3's shards in host memory (parallel.offload_params): the device keeps the units in flight,
  // and the shard of each of two sections copied there for its gather, or with
  // parallel.offload_params_device_copy the whole shard as the gathers send it.
  if (config.parallel.offload_params) {  // ZeRO-3 on a GPU (config::check_key_relations)
    m.state.host_parameters = m.state.parameters + m.state.master_weights;
    m.state.host_gradients = m.state.gradients;
    m.state.parameters = m.state.master_weights = m.state.gradients = 0;
    if (config.parallel.offload_params_device_copy) {
      m.state.parameters = ((parameter_count + dp - 1) / dp) * (compact ? 2 : 4);
    } else {
      m.gather_buffers += 2 * ((unit + dp - 1) / dp) * (compact ? 2 : 4);
    }
  }
  // The bf16 copy of the parameters the optimizer writes for the GEMMs (parallel/data/bf16_parameter_copy.h).
  if (parallel::keeps_bf16_parameter_copy(config)) m.state.parameters += 2 * parameter_count;
  if (compact) m.gather_buffers += unit * 4;              // the fp32 values of the unit in flight
  if (zero == 2) m.gather_buffers += parameter_count * 4;  // the full gradient buffer in backward
  if (zero == 3) m.gather_buffers += 2 * largest_neighbours(units) * 4;  // gathered units and their gradients
  return m;
}

// The stage's model state over its parameter groups, as the trainer reduces them: everything over
// the data- and context-parallel ranks (dp x cp), but under expert parallelism the routed experts
// (this rank's share of them) over the expert-data-parallel ranks (tp x cp x dp / ep), each group
// bucketed and sharded on its own.
void plan_model_state(const config::RunConfig& config, const std::vector<model::Parameter>& params,
                      comm::MeshShape shape, StageMemory& m) {
  const int replicas = shape.dp * shape.cp;
  std::vector<model::Parameter> dense, experts;
  for (const model::Parameter& p : params) {
    (shape.ep > 1 && p.name.find(".mlp.experts.") != std::string::npos ? experts : dense).push_back(p);
  }
  GroupState state = plan_group_state(config, dense, replicas);
  if (!experts.empty()) {
    const GroupState e = plan_group_state(config, experts, shape.tp * replicas / shape.ep);
    state.state.parameters += e.state.parameters;
    state.state.gradients += e.state.gradients;
    state.state.master_weights += e.state.master_weights;
    state.state.optimizer_moments += e.state.optimizer_moments;
    state.state.host_optimizer_moments += e.state.host_optimizer_moments;
    state.state.host_parameters += e.state.host_parameters;
    state.state.host_gradients += e.state.host_gradients;
    state.state.communication_buffers += e.state.communication_buffers;
    state.gather_buffers += e.gather_buffers;
  }
  m.state = state.state;
  m.gather_buffers += state.gather_buffers;
}

StageMemory plan_stage(const config::RunConfig& config, const PlannedLayout& layout, int stage,
                       const MemoryOptions& options) {
  const comm::MeshShape shape = layout.shape;
  ShapeGroup tp_group(shape.tp, 0);
  const model::TensorParallel tp(&tp_group, config.parallel.sequence_parallel);
  StageMemory m;
  m.stage = stage;
  m.chunks = layout.chunks.at(static_cast<size_t>(stage));
  StageParameters made;  // without a search's lists
  const StageParameters& stage_params = options.parameter_lists != nullptr
                                            ? options.parameter_lists->of(config.model, tp, m.chunks, shape.ep)
                                            : (made = stage_parameters(config.model, tp, m.chunks, shape.ep));
  const std::vector<model::Parameter>& params = stage_params.params;
  for (const model::Parameter& p : params) m.parameter_count += p.numel;

  plan_model_state(config, params, shape, m);

  const bool last = m.chunks.back().last == config.model.layers;
  std::vector<LayerWidths> widths = stage_params.widths;
  set_expert_row_multiples(widths, config);
  for (LayerWidths& w : widths) w.token_share = shape.tp;
  const int64_t head = head_rows(params, config.model.tied_embeddings, last);
  ActivationShape a{config.train.micro_batch, config.data.seq_len / shape.cp, shape.tp,
                    config.parallel.sequence_parallel, options.activation_bytes, options.attention_probs};
  a.cp = shape.cp;
  a.cp_all_to_all = config.parallel.cp_comm == config::ContextComm::A2a;
  a.ep = shape.ep;
  a.logit_bytes = bf16_logits_on_device(config, shape.tp) ? 2 : a.element_bytes;
  // An FP8 block whose MLP keeps its activation's codes only (Mlp::fp8_codes_from_activation) keeps
  // no activation; counted as the 2 bytes of the bf16 edge blocks' where those are kept (one count
  // serves every block: erring high).
  a.mlp_bytes = bf16_mlp_on_device(config)        ? 2
                : !fp8_mlp_codes_on_device(config) ? a.element_bytes
                : config.precision.fp8_edge_layers_bf16 ? 2
                                                        : 0;
  a.mlp_hidden_bytes = bf16_mlp_hidden_on_device(config) ? 2 : a.element_bytes;
  a.expert_bytes = bf16_mlp_on_device(config) ? 2 : a.element_bytes;
  a.expert_hidden_bytes = bf16_mlp_hidden_on_device(config) ? 2 : a.element_bytes;
  a.input_code_bytes = fp8_input_codes_on_device(config) ? 1 : 0;
  a.attention_bytes = bf16_attention_on_device(config) ? 2 : a.element_bytes;
  // An FP8 block's norms before q/k/v and up write those projections' codes and keep no output
  // (Norm::forward_codes); counted as the bf16 edge blocks' 2 bytes where those are kept (erring
  // high, as the MLP's activation above).
  a.normed_bytes = bf16_normed_on_device(config)                     ? 2
                   : !fp8_normed_codes_on_device(config, shape.tp) ? a.element_bytes
                   : config.precision.fp8_edge_layers_bf16          ? 2
                                                                    : 0;
  // Without a pipeline the model keeps one set; a pipeline rank one per (micro-batch, chunk) in
  // flight, pooled (activation_pool.h).
  std::vector<int64_t> chunk_bytes;
  for (const model::LayerRange& c : m.chunks) {
    chunk_bytes.push_back(
        micro_batch_activation_bytes(config.model, widths, {c}, c.last == config.model.layers ? head : 0, a));
  }
  m.activations_per_micro_batch = 0;
  for (int64_t b : chunk_bytes) m.activations_per_micro_batch += b;
  m.in_flight = layout.in_flight(stage);
  if (layout.schedule) {
    const PooledActivations pooled = pooled_activations(*layout.schedule, stage, chunk_bytes);
    m.activation_sets = pooled.sets;
    m.activations = pooled.bytes;
  } else {
    m.activations = m.activations_per_micro_batch;
  }
  m.workspace = workspace_bytes(config, widths, m.chunks, head, a) + weight_cast_cache_bytes(config, params, head) +
                tensor_parallel_gradient_sum_bytes(params, config.model.layers, shape.tp);
  m.widths = widths;
  m.head_rows = head;
  m.tp_gradient_sums = tensor_parallel_gradient_sums(params, config.model.layers, shape.tp);
  check_device_gemm_shapes(config, m, a.rows());
  if (options.kv_seq > 0) {
    for (const model::LayerRange& c : m.chunks) {
      for (int l = c.first; l < c.last; ++l) {
        m.kv_cache += 2 * widths[static_cast<size_t>(l)].kv * options.kv_seq * options.kv_batch * options.kv_bytes;
      }
    }
  }
  return m;
}

}  // namespace

int64_t MemoryPlan::peak() const {
  int64_t best = 0;
  for (const StageMemory& s : stages) best = std::max(best, s.total());
  return best;
}

MemoryPlan plan_memory(const config::RunConfig& config, comm::MeshShape shape, const MemoryOptions& options) {
  MemoryPlan plan;
  plan.layout = plan_layout(config, shape);
  for (int s = 0; s < plan.layout.stages(); ++s) plan.stages.push_back(plan_stage(config, plan.layout, s, options));
  return plan;
}

StageParameters stage_parameters(const config::ModelConfig& model, const model::TensorParallel& tp,
                                 const std::vector<model::LayerRange>& chunks, int ep) {
  StageParameters stage;
  stage.params = model::Transformer::parameter_list(model, tp, chunks, model::ExpertLayout{ep, 0});
  stage.widths = layer_widths(stage.params, model);
  return stage;
}

const StageParameters& StageParameterLists::of(const config::ModelConfig& model, const model::TensorParallel& tp,
                                               const std::vector<model::LayerRange>& chunks, int ep) {
  constexpr size_t kKept = 16;  // a mesh's stages, with and without sequence parallelism
  for (const Kept& k : kept_) {
    if (k.tp == tp.size() && k.ep == ep && k.sequence_parallel == tp.sequence_parallel() && k.chunks == chunks)
      return k.stage;
  }
  if (kept_.size() == kKept) kept_.pop_back();
  kept_.push_front({tp.size(), ep, tp.sequence_parallel(), chunks, stage_parameters(model, tp, chunks, ep)});
  return kept_.front().stage;
}

}  // namespace loom::plan
