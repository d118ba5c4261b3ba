#pragma once
// Expert parallelism (Megatron-Core's MoE layout): the experts of every MoE layer are split over
// the expert-parallel group (carved out of a stage's tensor x context x data-parallel ranks,
// tensor-parallel ranks first: comm/mesh.h), tokens move
// to their experts' ranks by all-to-all (model/moe_layer.h drives it through ExpertParallel),
// expert parameters are summed over the expert-data-parallel group and dense ones over the
// data-parallel group (two parameter groups), and once per step the routing statistics are
// summed over the ranks that route tokens: the expert loads move the aux-loss-free bias, and the
// step's tokens per expert, dropped fraction and balancing losses are reported.
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/model/expert_comm.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/gradient_sync.h"

namespace loom::parallel {

class ExpertParallel final : public model::ExpertComm {
 public:
  // ep: the expert-parallel group; routing: every rank routing tokens of the same layers.
  ExpertParallel(comm::Communicator& ep, comm::Communicator& routing) : ep_(&ep), routing_(&routing) {}
  int size() const override { return ep_->size(); }
  int rank() const override { return ep_->rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int64_t per_peer) override;
  void exchange_rows(const float* send, std::span<const int64_t> send_counts, float* recv,
                     std::span<const int64_t> recv_counts) override;
  void sum_over_routing_ranks(float* data, int64_t count) override;

  // Bytes this rank sent to other expert-parallel ranks in token exchanges, and the wall time
  // spent in them (counts included), since the last call; then zero.
  struct Counters {
    int64_t bytes = 0;
    double seconds = 0.0;
  };
  Counters take_counters();

 private:
  comm::Communicator* ep_;
  comm::Communicator* routing_;
  Counters counters_;
};

// A step's routing over every MoE layer and routing rank (the same on every rank).
struct MoeStepSummary {
  bool any = false;  // the model has MoE layers
  double tokens_min = 0, tokens_mean = 0, tokens_max = 0;  // selections per (layer, expert) in the global batch
  double dropped_fraction = 0;
  double aux_loss = 0, z_loss = 0;  // per micro-batch (coefficients included), summed over layers
  // This rank's own (not agreed): wall time in its MoE layers, in their token exchanges, and
  // the bytes it sent to other expert-parallel ranks.
  double layer_seconds = 0, exchange_seconds = 0;
  int64_t all_to_all_bytes = 0;
};

// Collective over `routing` (and `pp`, the pipeline stages, when given): sums each MoE layer's
// statistics since the last call, moves the expert biases (model.moe_expert_bias) by the global
// loads, clears the statistics and returns the summary.
MoeStepSummary finish_moe_step(model::Transformer& model, comm::Communicator& routing, comm::Communicator* pp,
                               ExpertParallel* exchange);

// Whether a parameter is a routed expert's (model.layers.N.mlp.experts.E.*).
bool is_expert_parameter(const std::string& name);
// Two groups: "dense" over `dp`, "expert" over `expert_dp`, its norm summed over `ep` too and
// added by the first tensor-parallel rank alone (`tp_rank` 0: the ep sum covers every rank of
// the stage).
std::vector<ParameterGroup> expert_parameter_groups(const model::Transformer& model, comm::Communicator& dp,
                                                    comm::Communicator& expert_dp, comm::Communicator& ep,
                                                    int tp_rank);

}  // namespace loom::parallel
