#include "loom/plan/time_plan.h"

#include <algorithm>
#include <cmath>

#include "loom/model/flops.h"
#include "loom/model/layer_spec.h"
#include "loom/model/linear_precision.h"
#include "loom/optim/host_offload.h"
#include "loom/optim/moment_arrays.h"
#include "loom/parallel/data/bf16_parameter_copy.h"
#include "loom/parallel/data/fp8_weight_pieces.h"
#include "loom/parallel/data/parameter_dtype.h"
#include "loom/plan/activation_memory.h"
#include "loom/plan/block_linears.h"
#include "loom/plan/cast_time.h"
#include "loom/plan/parallel_comm.h"
#include "loom/plan/stage_flops.h"

namespace loom::plan {

namespace {

struct StageCost {
  double forward = 0.0, backward = 0.0;  // one micro-batch, seconds
  double tp = 0.0, cp = 0.0, ep = 0.0, pp = 0.0;  // of which communication
  double tp_hidden = 0.0;                          // tensor-parallel collectives beside the GEMMs (not in the above)
  double casts = 0.0, fresh = 0.0;       // of which precision casts and handed-back memory
};

// AdamW per owned parameter: reads value, gradient and two moments, writes value and moments
// (fp32), and the gradient norm reads the gradient once more. Then every gradient the rank holds
// (its whole buffer, owned or not) is zeroed for the next step, 4 bytes written each, but the
// blocks' linear weights' (written whole by their first wgrad GEMM: model/parameters.h) outside
// ZeRO-3 (which zeroes its sections itself).
constexpr double kOptimizerBytesPerParameter = 32.0;
constexpr double kZeroedBytesPerGradient = 4.0;
// Offloaded to the host (optim.cpu_offload): the device reads each gradient for the norm; the link
// moves gradient and value down and the value up; the host's update reads value, gradient and
// moments and writes value and moments.
constexpr double kNormBytesPerParameter = 4.0;
constexpr double kOffloadLinkBytesPerParameter = 12.0;
constexpr double kOffloadHostBytesPerParameter = 28.0;
// ZeRO-3's shards in host memory (parallel.offload_params): the link carries each section's shard
// to the device for its two gathers a micro-batch (in the gathers' dtype; once a step into the
// device's copy with parallel.offload_params_device_copy) and its reduced gradient
// back (in the wire dtype), which the host reads, widens and adds into the fp32 gradient shard (8
// bytes); the update needs no link, and the norm reads the gradients in host memory.
constexpr double kShardAddHostBytesPerParameter = 8.0;


// The offloaded update's link and host-memory seconds for `elements` on the host: its chunks of
// optim::kOffloadChunkElements pipelined (optim/host_offload.h), the link's transfers of the
// chunks before and after one running while the host updates it, so the longer of the two counts
// whole and the shorter for one chunk's share.
double offloaded_update_seconds(double link, double host, double elements) {
  const double chunks = std::max(1.0, std::ceil(elements / static_cast<double>(optim::kOffloadChunkElements)));
  return std::max(link, host) + std::min(link, host) / chunks;
}

// The share of micro-batches whose blocks' wgrad GEMMs write their gradients whole (4 bytes, not
// read and added to: 8): the first of a step; every one at ZeRO-2, which zeroes the gradients after
// each micro-batch's reduce-scatter; none at ZeRO-3, which zeroes its sections itself.
double written_whole_share(const config::RunConfig& config, double micro_batches) {
  const int zero = config.parallel.zero;  // the stage runs at one replica too
  if (zero == 3) return 0.0;
  return zero == 2 ? 1.0 : 1.0 / micro_batches;
}

// The blocks' linear weights of a stage: their gradients are written whole (written_whole_share).
double block_linear_weights(const config::RunConfig& config, const StageMemory& stage) {
  double weights = 0.0;
  for_each_block_linear(config, stage, 1.0, [&](double out, double in, model::Recipe, LinearRole role, double) {
    if (!is_expert(role) && role != LinearRole::Latent && role != LinearRole::Replicated) weights += out * in;
  });
  return weights;
}

// Bytes this rank's GEMMs write per micro-batch (Hardware::gemm_output_seconds): each linear's
// forward output and dgrad's input gradient, 2 bytes each where a GPU leaves it bf16 (Bf16Ends)
// and 4 otherwise, and wgrad's fp32 main gradient, read and added to (8) or written whole (4,
// written_whole_share). The blocks' forward apart: a recompute writes it again (not eh_proj's,
// counted with the head's).
struct GemmOutputBytes {
  double block_forward = 0.0, head_forward = 0.0, backward = 0.0;
};

GemmOutputBytes gemm_output_bytes(const config::RunConfig& config, const StageMemory& stage, double tokens, int tp,
                                  double written_whole) {
  const CastPath path = cast_path(config, 1.0, tp);
  GemmOutputBytes bytes;
  for_each_block_linear(config, stage, tokens,
                        [&](double out, double in, model::Recipe r, LinearRole role, double rows) {
    const Bf16Ends ends = device_bf16_ends(path, r, role);
    const bool added = is_expert(role) || role == LinearRole::Latent || role == LinearRole::Replicated;
    const double whole = added ? 0.0 : written_whole;
    (role == LinearRole::Replicated ? bytes.head_forward : bytes.block_forward) +=
        tokens * rows * out * (ends.output ? 2.0 : 4.0);
    bytes.backward += tokens * rows * in * (ends.input_grad ? 2.0 : 4.0) + (8.0 - 4.0 * whole) * out * in;
  });
  if (stage.head_rows > 0) {
    const double rows = static_cast<double>(stage.head_rows), d = static_cast<double>(config.model.d_model);
    bytes.head_forward += tokens * rows * (path.bf16_logits ? 2.0 : 4.0);
    bytes.backward += tokens * d * 4.0 + 8.0 * rows * d;
  }
  return bytes;
}

// Memory handed back to the system between uses and faulted in again, per micro-batch: ZeRO-2's
// gradient buffer after each micro-batch's reduce-scatter; ZeRO-3's gathered parameters after
// each unit's forward and backward and its gradients after their reduce-scatter; compact
// parameters (precision.param_dtype=compute) widened from their 2-byte store before each unit's
// forward and backward (which also costs the widening, a cast, where casts cost time).
double fresh_memory_seconds(const config::RunConfig& config, const StageMemory& stage, const Hardware& hw) {
  const double params = static_cast<double>(stage.parameter_count);
  const bool compact = parallel::parameter_dtype(config) != DType::F32;
  const int zero = config.parallel.zero;  // the stage runs at one replica too
  double fresh_bytes = 0.0, widened = 0.0;
  if (zero == 2) fresh_bytes += 4.0 * params;
  if (zero == 3) fresh_bytes += 3.0 * 4.0 * params;
  if (compact && zero != 3) {
    fresh_bytes += 2.0 * 4.0 * params;
    widened = 2.0 * params;
  }
  return hw.fresh_memory_seconds(fresh_bytes, 1) + hw.cast_seconds(widened, false, 1);
}

// Adds to `cost` context parallelism's attention exchanges for one micro-batch of `rows` tokens on
// this rank, over every attention layer of the stage, as parallel/context/ runs them;
// `attention_seconds(l)` is layer l's attention products on this rank, forward and backward (a
// third, two thirds).
// - ring (p2p): each of a layer's cp - 1 forward hops sends the key/value block held (rows x 2 kv)
//   while the rank computes attention over it, so only what that block's compute does not cover
//   shows; backward's block hops likewise, and its cp gradient hops, each waited after a block's
//   compute, all show.
// - all-to-all (a2a): q/k/v to heads and the output back, forward, and the output's gradient to
//   heads and q/k/v's back, backward; none hidden.
// Both exchange fp32 (kCommBytes), whatever the attention's operands.
template <typename AttentionSeconds>
void add_context_parallel_cost(StageCost& cost, const config::RunConfig& config, const StageMemory& stage, double rows,
                               int cp, const Link& link, AttentionSeconds attention_seconds) {
  double forward = 0.0, backward = 0.0;
  const bool all_to_all = config.parallel.cp_comm == config::ContextComm::A2a;
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) {
      const LayerWidths& w = stage.widths[static_cast<size_t>(l)];
      if (!w.has_attention()) continue;
      if (all_to_all) {
        const double both = all_to_all_seconds(rows * w.qkv() * kCommBytes, cp, link) +
                            all_to_all_seconds(rows * w.q * kCommBytes, cp, link);
        forward += both;
        backward += both;
        continue;
      }
      const double hop = link.latency + rows * 2.0 * w.kv * kCommBytes / link.bandwidth;
      const double compute = attention_seconds(l);
      forward += (cp - 1) * std::max(0.0, hop - compute / 3.0 / cp);
      backward += (cp - 1) * std::max(0.0, hop - 2.0 * compute / 3.0 / cp) + cp * hop;
    }
  }
  cost.cp = forward + backward;
  cost.forward += forward;
  cost.backward += backward;
}

// The tensor-parallel collectives of one micro-batch: the step waits for all but those the
// column-parallel backwards hide behind their GEMMs.
void add_tensor_parallel_cost(StageCost& cost, const TpSeconds& tp) {
  cost.tp = tp.forward + tp.backward - tp.hidden_backward;
  cost.tp_hidden = tp.hidden_backward;
  cost.forward += tp.forward;
  cost.backward += tp.backward - tp.hidden_backward;
}

// Threads of one rank on a shared host, as the trainer gives them (config::TrainConfig::
// threads_per_rank, the ranks all in one process); one elsewhere (a device's rates are its own).
int rank_threads(const config::RunConfig& config, const Hardware& hw, int world) {
  return hw.shared ? config.train.threads_per_rank(hw.processors, world) : 1;
}

StageCost stage_cost(const config::RunConfig& config, const MemoryPlan& memory, const StageMemory& stage,
                     const Hardware& hw) {
  const comm::MeshShape shape = memory.layout.shape;
  const int world = shape.tp * shape.cp * shape.dp * shape.pp;
  const std::vector<model::LayerSpec> specs = model::resolve_layers(config.model);
  // This rank's tokens: a context-parallel rank holds seq_len / cp of each sequence (its
  // attention still sees every key: the per-token FLOPs are the whole sequence's).
  const double tokens = static_cast<double>(config.train.micro_batch) * config.data.seq_len / shape.cp;
  const StageFlops flops = stage_flops(config, stage, specs);
  // Rates of one rank alone; plan_time accounts for ranks sharing a host's cores. FP8 linears at
  // the device's FP8 rate, attention's score and value products at its attention rate, the
  // Mamba-2 scans at the scan kernels' rate, the rest
  // (bf16 layers, the head) at its GEMM rate. The FP8 linears' FLOPs are this rank's share (the
  // routed experts' too: the rank's share of the tokens): the group's are tp times them. The
  // replicated parts (a MoE layer's router forward) and eh_proj, computed whole by every rank,
  // are not shared out.
  const int threads = rank_threads(config, hw, world);
  const double gemm_speedup = hw.gemm_speedup(threads), memory_speedup = hw.memory_speedup(threads);
  const double rate = hw.flops_per_rank(1) * gemm_speedup * hw.gemm_rows_factor(tokens);
  const double fp8_rate = hw.fp8_flops_per_rank(1) * gemm_speedup * hw.gemm_rows_factor(tokens);
  const double attention_rate = hw.attention_flops_per_rank(1) * gemm_speedup;
  const double scan_rate = hw.scan_flops_per_rank(1) * gemm_speedup;
  const Fp8Flops fp8 = fp8_linear_flops_per_token(config, stage);
  const double split = flops.block - flops.replicated, split_fp8 = shape.tp * (fp8.split + fp8.experts);
  const double split_seconds =
      ((split - split_fp8 - flops.attention - flops.scan) / rate + split_fp8 / fp8_rate +
       flops.attention / attention_rate + flops.scan / scan_rate) *
      tokens / shape.tp;
  const double replicated_seconds = flops.replicated / rate * tokens + expert_padding_flops(config, stage) / fp8_rate;
  const double block_seconds = split_seconds + replicated_seconds;
  const double gemm = block_seconds + tokens * flops.head / shape.tp / rate +
                      tokens * replicated_linear_flops_per_token(config, stage) / rate;
  const double m = static_cast<double>(memory.layout.micro_batches);
  const GemmOutputBytes written =
      gemm_output_bytes(config, stage, tokens, shape.tp, written_whole_share(config, m));
  const double written_forward = hw.gemm_output_seconds(written.block_forward + written.head_forward);
  const double written_backward = hw.gemm_output_seconds(written.backward);
  const double recompute =
      config.model.recompute ? block_seconds / 3.0 + hw.gemm_output_seconds(written.block_forward) : 0.0;
  const double elementwise =
      static_cast<double>(stage.activations_per_micro_batch) / (hw.activation_rate_per_rank(1) * memory_speedup);
  StageCost cost;
  cost.casts = cast_seconds(config, stage, tokens, static_cast<double>(memory.layout.micro_batches), shape.tp, hw) /
               memory_speedup;
  cost.fresh = fresh_memory_seconds(config, stage, hw) / memory_speedup;
  cost.forward = gemm / 3.0 + written_forward + elementwise / 3.0 + (cost.casts + cost.fresh) / 3.0;
  cost.backward = 2.0 * gemm / 3.0 + written_backward + recompute + 2.0 * elementwise / 3.0 +
                  2.0 * (cost.casts + cost.fresh) / 3.0;
  if (shape.tp > 1) {
    const Link& link = hw.link(group_link(hw, shape.tp, 1, world));
    add_tensor_parallel_cost(cost, tensor_parallel_seconds(config, stage, tokens, shape.tp, link, {rate, fp8_rate}));
  }
  if (shape.cp > 1) {
    const Link& link = hw.link(group_link(hw, shape.cp, shape.tp, world));
    add_context_parallel_cost(cost, config, stage, tokens, shape.cp, link, [&](int l) {
      const model::LayerSpec& spec = specs[static_cast<size_t>(l)];
      return model::attention_training_flops_per_token(config.model, spec, config.data.seq_len) * tokens / shape.tp /
             attention_rate;
    });
  }
  if (shape.ep > 1) {
    // The expert-parallel groups are consecutive ranks (the tensor-parallel ones first).
    const Link& link = hw.link(group_link(hw, shape.ep, 1, world));
    cost.ep = expert_parallel_seconds(config, stage, tokens / shape.tp, shape.ep, link);
    cost.forward += cost.ep / 2.0;
    cost.backward += cost.ep / 2.0;
  }
  if (shape.pp > 1) {
    const double rows = config.parallel.sequence_parallel && shape.tp > 1 ? tokens / shape.tp : tokens;
    const Link& link = hw.link(group_link(hw, shape.pp, shape.tp * shape.cp * shape.dp, world));
    const double send = link.latency + rows * config.model.d_model * kCommBytes / link.bandwidth;
    cost.pp = 2.0 * send * static_cast<double>(stage.chunks.size());
    cost.forward += cost.pp / 2.0;
    cost.backward += cost.pp / 2.0;
  }
  return cost;
}

// A step's data-parallel collectives: those that run beside backward (the gradients' and, at
// ZeRO-3, every gather of a micro-batch) and the distributed optimizer's parameter all-gather
// after the update (ZeRO 1-2), which the step waits for unless parallel.overlap_param_gather.
struct DataParallelSeconds {
  double during_backward = 0.0;
  double parameter_gather = 0.0;
};

DataParallelSeconds data_parallel_seconds(const config::RunConfig& config, const MemoryPlan& memory,
                                          const StageMemory& stage, const Hardware& hw) {
  const comm::MeshShape shape = memory.layout.shape;
  // The gradients reduce over the data- and context-parallel ranks together (Mesh::dp_cp).
  const int replicas = shape.dp * shape.cp;
  if (replicas == 1) return {};
  const int world = shape.tp * shape.cp * shape.dp * shape.pp;
  const Link& link = hw.link(group_link(hw, replicas, shape.tp, world));
  const double wire = config.precision.grad_reduce == config::GradReduce::Bf16 ? 2.0 : 4.0;
  const double grads = static_cast<double>(stage.parameter_count) * wire;
  const int zero = config.parallel.zero;
  if (zero == 0) return {all_reduce_seconds(grads, replicas, link), 0.0};
  const double params =
      static_cast<double>(stage.parameter_count) * static_cast<double>(dtype_size(parallel::parameter_dtype(config)));
  const double m = memory.layout.micro_batches;
  if (zero == 1) return {all_gather_seconds(grads, replicas, link), all_gather_seconds(params, replicas, link)};
  if (zero == 2) return {m * all_gather_seconds(grads, replicas, link), all_gather_seconds(params, replicas, link)};
  return {m * (2.0 * all_gather_seconds(params, replicas, link) + all_gather_seconds(grads, replicas, link)), 0.0};
}

// What the step waits for of the parameter all-gather: all of it, or, overlapped with the next
// forward, what outlasts the first micro-batch's forward, and at least the first bucket's share
// (the embedding's, which nothing computes before).
double exposed_parameter_gather(const config::RunConfig& config, const StageMemory& stage, double gather,
                                double forward) {
  if (!config.parallel.overlap_param_gather || gather <= 0.0) return gather;
  const double bucket_bytes = config.parallel.bucket_mb * 1024.0 * 1024.0;
  const double buckets = std::max(1.0, std::ceil(static_cast<double>(stage.parameter_count) * 4.0 / bucket_bytes));
  return std::max(gather / buckets, gather - forward);
}

}  // namespace

comm::LinkClass group_link(const Hardware& hw, int size, int stride, int world) {
  (void)world;
  const int64_t span = static_cast<int64_t>(size - 1) * stride + 1;
  return span <= hw.ranks_per_node ? comm::LinkClass::SameNode : comm::LinkClass::SameSite;
}

double all_reduce_seconds(double bytes, int ranks, const Link& link) {
  if (ranks <= 1) return 0.0;
  const double steps = 2.0 * (ranks - 1);
  return steps * link.latency + steps / ranks * bytes / link.bandwidth;
}

double all_gather_seconds(double bytes, int ranks, const Link& link) { return all_reduce_seconds(bytes, ranks, link) / 2.0; }

TimeBreakdown plan_time(const config::RunConfig& config, const MemoryPlan& memory, const Hardware& hw) {
  const comm::MeshShape shape = memory.layout.shape;
  const int world = shape.tp * shape.cp * shape.dp * shape.pp, replicas = shape.dp * shape.cp;
  const int threads = rank_threads(config, hw, world);
  StageCost worst;
  const StageMemory* widest = &memory.stages.front();
  for (const StageMemory& s : memory.stages) {
    const StageCost c = stage_cost(config, memory, s, hw);
    if (c.forward + c.backward > worst.forward + worst.backward) worst = c;
    if (s.parameter_count > widest->parameter_count) widest = &s;
  }
  const int m = memory.layout.micro_batches;
  TimeBreakdown t;
  double makespan = m * (worst.forward + worst.backward);
  if (memory.layout.schedule) {
    makespan = parallel::simulate_pipeline(*memory.layout.schedule, {worst.forward, worst.backward}).makespan;
  }
  const double busy = m * (worst.forward + worst.backward);
  t.tp_comm = m * worst.tp;
  t.tp_comm_hidden = m * worst.tp_hidden;
  t.cp_comm = m * worst.cp;
  t.ep_comm = m * worst.ep;
  t.pp_comm = m * worst.pp;
  t.casts = m * worst.casts;
  t.memory = m * worst.fresh;
  t.compute = busy - t.tp_comm - t.cp_comm - t.ep_comm - t.pp_comm - t.casts - t.memory;
  t.bubble = makespan - busy;
  if (hw.shared) {
    // Ranks sharing a host's cores: a rank idle in the pipeline bubble leaves its cores to the
    // others, so the step is at least every rank's work over the cores, each rank busy on
    // min(threads, cores) of them, and at least one rank's schedule at the rate it gets alone.
    const double alone = std::min(static_cast<double>(threads), hw.cores);
    const double shared = world * busy * alone / hw.cores;
    t.core_wait = std::max(0.0, shared - makespan);
    makespan = std::max(makespan, shared);
  }
  const DataParallelSeconds dp = data_parallel_seconds(config, memory, *widest, hw);
  t.dp_comm = (1.0 - hw.comm_overlap) * dp.during_backward +
              exposed_parameter_gather(config, *widest, dp.parameter_gather, worst.forward);
  const double owned = config.parallel.zero >= 1 ? static_cast<double>(widest->parameter_count) / replicas
                                                 : static_cast<double>(widest->parameter_count);
  // The bf16 copy of the parameters, where kept, is 2 more bytes written per parameter.
  const double copy_bytes = parallel::keeps_bf16_parameter_copy(config) ? 2.0 : 0.0;
  const double written_whole =
      written_whole_share(config, m) > 0.0 ? block_linear_weights(config, *widest) : 0.0;
  const double zeroed = kZeroedBytesPerGradient * (static_cast<double>(widest->parameter_count) - written_whole);
  // For the share offloaded to the host (optim.cpu_offload, optim.offload_fraction; none by
  // default) the device reads the gradients for their norm, the host link carries them and the
  // values down and the values up, and the host's memory serves the update (optim/host_offload.h).
  const bool gpu = config.runtime.device == config::RuntimeDevice::Cuda;
  const double on_host = optim::offloaded_share(config.optim, gpu) * owned, on_device = owned - on_host;
  // With ZeRO-3's shards in host memory too (parallel.offload_params) the gradients are read for
  // their norm there, and nothing crosses the link for the update.
  const bool shards_on_host = config.parallel.offload_params;  // ZeRO-3 on a GPU (config::check_key_relations)
  const double norm_bytes = kNormBytesPerParameter * on_host;
  const double device_bytes =
      (shards_on_host ? 0.0 : norm_bytes) + (kOptimizerBytesPerParameter + copy_bytes) * on_device + zeroed;
  const double link_bytes = shards_on_host ? 0.0 : kOffloadLinkBytesPerParameter * on_host;
  const double host_bytes = kOffloadHostBytesPerParameter * on_host + (shards_on_host ? norm_bytes : 0.0);
  t.optimizer = device_bytes / (hw.bandwidth_per_rank(world) * hw.memory_speedup(threads)) +
                offloaded_update_seconds(link_bytes / hw.host_link_bandwidth, host_bytes / hw.host_memory_bandwidth,
                                         on_host);
  if (shards_on_host) {
    const auto gathered = static_cast<double>(dtype_size(parallel::parameter_dtype(config)));
    const double wire = config.precision.grad_reduce == config::GradReduce::Bf16 && replicas > 1 ? 2.0 : 4.0;
    // The gathers' shard goes down twice a micro-batch, or once a step into the device's copy
    // (parallel.offload_params_device_copy).
    const bool device_copy = config.parallel.offload_params_device_copy;
    const double down_per_micro_batch = device_copy ? 0.0 : 2.0 * gathered;
    t.host_link = m * owned *
                      ((down_per_micro_batch + wire) / hw.host_link_bandwidth +
                       (kShardAddHostBytesPerParameter + wire) / hw.host_memory_bandwidth) +
                  (device_copy ? owned * gathered / hw.host_link_bandwidth : 0.0);
  }
  t.overhead = hw.step_overhead;
  t.step = makespan + t.dp_comm + t.host_link + t.optimizer + t.overhead;
  return t;
}

}  // namespace loom::plan
