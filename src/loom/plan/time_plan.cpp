#include "loom/plan/time_plan.h"

#include <algorithm>

#include "loom/model/flops.h"
#include "loom/model/layer_spec.h"

namespace loom::plan {

namespace {

struct StageCost {
  double forward = 0.0, backward = 0.0;  // one micro-batch, seconds
  double tp = 0.0, pp = 0.0;             // of which communication
};

// Passes over the activations besides GEMMs: forward writes them, backward reads and writes.
constexpr double kActivationPasses = 3.0;
// AdamW per parameter: reads value, gradient and two moments, writes value and moments (fp32),
// and the gradient norm reads the gradient once more.
constexpr double kOptimizerBytesPerParameter = 32.0;

StageCost stage_cost(const config::RunConfig& config, const MemoryPlan& memory, const StageMemory& stage,
                     const Hardware& hw) {
  const comm::MeshShape shape = memory.layout.shape;
  const int world = shape.tp * shape.dp * shape.pp;
  const std::vector<model::LayerSpec> specs = model::resolve_layers(config.model);
  const double tokens = static_cast<double>(config.train.micro_batch) * config.data.seq_len;
  double block_flops = 0.0, head_flops = 0.0;
  int layers = 0;
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) {
      block_flops += model::layer_training_flops_per_token(config.model, specs[static_cast<size_t>(l)], config.data.seq_len);
      ++layers;
    }
  }
  if (stage.chunks.back().last == config.model.layers) {
    head_flops = model::head_training_flops_per_token(config.model, config.data.seq_len);
  }
  const double rate = hw.flops_per_rank(world) * hw.gemm_rows_factor(tokens),
               bandwidth = hw.bandwidth_per_rank(world);
  const double gemm = tokens * (block_flops + head_flops) / shape.tp / rate;
  const double recompute = config.model.recompute ? tokens * block_flops / shape.tp / rate / 3.0 : 0.0;
  const double elementwise = kActivationPasses * static_cast<double>(stage.activations_per_micro_batch) / bandwidth;
  StageCost cost;
  cost.forward = gemm / 3.0 + elementwise / 3.0;
  cost.backward = 2.0 * gemm / 3.0 + recompute + 2.0 * elementwise / 3.0;
  if (shape.tp > 1) {
    const double stream = tokens * config.model.d_model * hw.activation_bytes;
    const Link& link = hw.link(group_link(hw, shape.tp, 1, world));
    int sub_blocks = 0;
    for (const model::LayerRange& c : stage.chunks) {
      for (int l = c.first; l < c.last; ++l) {
        sub_blocks += specs[static_cast<size_t>(l)].has_attention + specs[static_cast<size_t>(l)].has_mlp();
      }
    }
    const double one = all_reduce_seconds(stream, shape.tp, link);
    cost.tp = 2.0 * (sub_blocks + 1) * one;  // each sub-block forward and backward; embedding or head
    cost.forward += cost.tp / 2.0;
    cost.backward += cost.tp / 2.0;
  }
  if (shape.pp > 1) {
    const double rows = config.parallel.sequence_parallel && shape.tp > 1 ? tokens / shape.tp : tokens;
    const Link& link = hw.link(group_link(hw, shape.pp, shape.tp * shape.dp, world));
    const double send = link.latency + rows * config.model.d_model * hw.activation_bytes / link.bandwidth;
    cost.pp = 2.0 * send * static_cast<double>(stage.chunks.size());
    cost.forward += cost.pp / 2.0;
    cost.backward += cost.pp / 2.0;
  }
  return cost;
}

double data_parallel_seconds(const config::RunConfig& config, const MemoryPlan& memory, const StageMemory& stage,
                             const Hardware& hw) {
  const comm::MeshShape shape = memory.layout.shape;
  if (shape.dp == 1) return 0.0;
  const int world = shape.tp * shape.dp * shape.pp;
  const Link& link = hw.link(group_link(hw, shape.dp, shape.tp, world));
  const double wire = config.precision.grad_reduce == config::GradReduce::Bf16 ? 2.0 : 4.0;
  const double grads = static_cast<double>(stage.parameter_count) * wire;
  const int zero = config.parallel.zero;
  if (zero == 0 || zero == 1) return all_reduce_seconds(grads, shape.dp, link);
  const double params = static_cast<double>(stage.parameter_count) *
                        (config.precision.param_dtype == config::ParamDtype::Compute ? 2.0 : 4.0);
  const double m = memory.layout.micro_batches;
  if (zero == 2) return m * all_gather_seconds(grads, shape.dp, link) + all_gather_seconds(params, shape.dp, link);
  return m * (2.0 * all_gather_seconds(params, shape.dp, link) + all_gather_seconds(grads, shape.dp, link));
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
  const int world = shape.tp * shape.dp * shape.pp;
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
  t.tp_comm = m * worst.tp;
  t.pp_comm = m * worst.pp;
  t.compute = m * (worst.forward + worst.backward) - t.tp_comm - t.pp_comm;
  t.bubble = makespan - m * (worst.forward + worst.backward);
  t.dp_comm = (1.0 - hw.comm_overlap) * data_parallel_seconds(config, memory, *widest, hw);
  const double owned = config.parallel.zero >= 1 ? static_cast<double>(widest->parameter_count) / shape.dp
                                                 : static_cast<double>(widest->parameter_count);
  t.optimizer = kOptimizerBytesPerParameter * owned / hw.bandwidth_per_rank(world);
  t.overhead = hw.step_overhead;
  t.step = makespan + t.dp_comm + t.optimizer + t.overhead;
  return t;
}

}  // namespace loom::plan
