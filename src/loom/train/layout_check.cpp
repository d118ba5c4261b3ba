#include "loom/train/layout_check.h"

#include <cstdint>
#include <string>

#include "loom/config/rampup_value.h"
#include "loom/core/error.h"
#include "loom/model/layer_spec.h"

namespace loom::train {

namespace {

// Heads a tensor-parallel rank holds: split over tp, kv heads replicated when fewer than tp.
int heads_per_tp_rank(int heads, int tp) { return heads >= tp ? heads / tp : 1; }

// Context parallelism: the sequence cuts into 2 x cp chunks (two per rank, for load balance);
// Ulysses (a2a) also splits each tensor-parallel rank's heads and kv heads over the cp ranks.
void check_context_parallel(const config::RunConfig& config) {
  const int cp = config.parallel.cp, tp = config.parallel.tp, seq = config.data.seq_len;
  if (cp == 1) return;
  const std::string cps = std::to_string(cp);
  LOOM_CHECK(seq % (2 * cp) == 0, "data.seq_len " + std::to_string(seq) + " must be a multiple of 2 x parallel.cp = " +
                                      std::to_string(2 * cp) + " (each context-parallel rank holds 2 of 2 x cp equal chunks)");
  if (config.parallel.cp_comm != config::ContextComm::A2a) return;
  LOOM_CHECK(config.model.heads % tp == 0 && (config.model.heads / tp) % cp == 0,
             "parallel.cp_comm = a2a splits each tensor-parallel rank's heads over the context-parallel ranks: model.heads " +
                 std::to_string(config.model.heads) + " / parallel.tp " + std::to_string(tp) + " must be a multiple of parallel.cp " +
                 cps + " (or use parallel.cp_comm = p2p)");
  const std::vector<model::LayerSpec> layers = model::resolve_layers(config.model);
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].has_attention) continue;
    const int kv = heads_per_tp_rank(layers[l].kv_heads, tp);
    LOOM_CHECK(kv % cp == 0, "parallel.cp_comm = a2a splits the kv heads over the context-parallel ranks: layer " +
                                 std::to_string(l) + " has " + std::to_string(layers[l].kv_heads) + " kv heads, " +
                                 std::to_string(kv) + " per tensor-parallel rank (parallel.tp " + std::to_string(tp) +
                                 "), not a multiple of parallel.cp " + cps + " (or use parallel.cp_comm = p2p)");
  }
}

// Every batch of train.rampup_batch_size splits into whole micro-batches on each data-parallel
// rank, and under the interleaved schedule into whole rounds of the pipeline's stages.
void check_rampup_layout(const config::RunConfig& config, int dp) {
  const config::BatchRampup& r = config.train.rampup_batch_size;
  if (!r.on()) return;
  const BatchUnit unit = batch_unit(config, dp);
  LOOM_CHECK(r.start % unit.rows == 0 && r.increment % unit.rows == 0,
             "train.rampup_batch_size = " + config::detail::Value<config::BatchRampup>::show(r) +
                 ": each batch of the ramp-up must be a multiple of " + unit.what + " = " + std::to_string(unit.rows) +
                 ", so its start and increment must be");
}

}  // namespace

BatchUnit batch_unit(const config::RunConfig& config, int dp) {
  const bool rounds =
      config.parallel.pp > 1 && config.parallel.pipeline_schedule == config::PipelineScheduleKind::Interleaved;
  BatchUnit unit;
  unit.rows = static_cast<int64_t>(config.train.micro_batch) * dp * (rounds ? config.parallel.pp : 1);
  unit.what = "train.micro_batch " + std::to_string(config.train.micro_batch) + " x data-parallel ranks " +
              std::to_string(dp) +
              (rounds ? " x parallel.pp " + std::to_string(config.parallel.pp) + " (the interleaved schedule's rounds)"
                      : "");
  return unit;
}

comm::MeshShape check_layout(const config::RunConfig& config, int world_size) {
  const int tp = config.parallel.tp, cp = config.parallel.cp, pp = config.parallel.pp;
  const std::string world = std::to_string(world_size) + " ranks (runtime.ranks or the launcher's)";
  // The context-parallel size is named when it is in play.
  const std::string sizes = cp == 1 ? "parallel.tp x parallel.pp = " + std::to_string(tp) + " x " + std::to_string(pp)
                                    : "parallel.tp x parallel.cp x parallel.pp = " + std::to_string(tp) + " x " +
                                          std::to_string(cp) + " x " + std::to_string(pp);
  LOOM_CHECK(world_size % (tp * cp * pp) == 0, sizes + " does not divide the world's " + world);
  const int dp = world_size / (tp * cp * pp);
  LOOM_CHECK(config.parallel.dp == 0 || config.parallel.dp == dp,
             "parallel.dp is " + std::to_string(config.parallel.dp) + " but the world has " + world +
                 ", parallel.tp = " + std::to_string(tp) + ", parallel.cp = " + std::to_string(cp) +
                 " and parallel.pp = " + std::to_string(pp) + "; use 0 (auto) or " + std::to_string(dp));
  LOOM_CHECK(config.parallel.dp_sites == 0 || dp % config.parallel.dp_sites == 0,
             "parallel.dp_sites " + std::to_string(config.parallel.dp_sites) +
                 " does not divide the data-parallel ranks " + std::to_string(dp) +
                 "; every site holds the same number of them (valid: 0 = from topology, or a divisor of " +
                 std::to_string(dp) + ")");
  // A site must hold whole replicas; with context parallelism a replica is cp ranks, which
  // parallel.dp_sites (a split of the replicas' group) and DiLoCo's independent sites do not keep together.
  LOOM_CHECK(cp == 1 || (config.parallel.dp_sites <= 1 && config.parallel.outer == config::OuterOptimizer::None),
             "parallel.cp " + std::to_string(cp) + " does not combine with parallel.dp_sites " +
                 std::to_string(config.parallel.dp_sites) + " or parallel.outer = diloco yet; use parallel.cp = 1 "
                 "across sites (topology.nodes_per_site alone, which reduces over node blocks, works)");
  const int64_t per_step = static_cast<int64_t>(config.train.micro_batch) * dp;
  LOOM_CHECK(config.train.global_batch % per_step == 0,
             "train.global_batch " + std::to_string(config.train.global_batch) +
                 " must be a multiple of train.micro_batch " + std::to_string(config.train.micro_batch) +
                 " x data-parallel ranks " + std::to_string(dp));
  const int ep = config.parallel.ep;
  LOOM_CHECK(tp * cp * dp % ep == 0,
             "parallel.ep = " + std::to_string(ep) + " must divide the " + std::to_string(tp * cp * dp) +
                 " ranks of a pipeline stage (tp " + std::to_string(tp) + " x cp " + std::to_string(cp) + " x dp " +
                 std::to_string(dp) + "; expert parallelism is carved out of them, tensor-parallel ranks first)");
  LOOM_CHECK(ep == 1 || config.model.moe.experts % ep == 0,
             "parallel.ep = " + std::to_string(ep) + " must divide model.moe_experts = " +
                 std::to_string(config.model.moe.experts) + " (each expert-parallel rank holds experts / ep of them)");
  check_context_parallel(config);
  check_rampup_layout(config, dp);
  return comm::MeshShape{.tp = tp, .cp = cp, .ep = ep, .dp = dp, .pp = pp};
}

}  // namespace loom::train
