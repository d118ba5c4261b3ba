#pragma once
// Token dispatch of one routing group: which selections each expert takes (capacity and drops),
// the permutation that groups rows by expert, and the bookkeeping of the all-to-all exchange
// between expert-parallel ranks (counts per peer and expert, and the reordering of received
// rows from peer-major to expert-major and back).
//
// Capacity: with capacity factor c, each expert takes at most ceil(c * tokens * k / E) of the
// group's selections, decided over the group (this rank's micro-batch) before any exchange, so
// the decision does not depend on how many expert-parallel ranks there are. `probs` keeps the
// highest weights (ties: earlier token), `position` the earliest tokens. Dropped selections
// contribute nothing; the other weights are not renormalised.
#include <cstdint>
#include <vector>

#include "loom/config/enums.h"
#include "loom/core/device.h"

namespace loom::model {

struct DispatchPlan {
  int64_t tokens = 0;
  int top_k = 0, experts = 0;
  std::vector<int64_t> order;        // dispatched row -> selection index (token * k + i), by expert then token
  std::vector<int64_t> expert_rows;  // [E] rows each expert takes
  std::vector<uint8_t> kept;         // [tokens * k]
  int64_t dropped = 0;
};

// Per expert, the selections it can take (0 = no limit: dropless).
int64_t expert_capacity(int64_t tokens, int top_k, int experts, double capacity_factor);

DispatchPlan plan_dispatch(const int32_t* expert, const float* weight, int64_t tokens, int top_k, int experts,
                           double capacity_factor, config::MoeDropPolicy policy);

// The part of `plan` whose tokens are [first, first + tokens), as a plan over those tokens alone
// (selection and token indices counted from `first`; rows still by expert, then token). Each
// tensor-parallel rank dispatches its share of the group's tokens from the group's plan, so
// capacity and drops stay decided over the whole group.
DispatchPlan share_of_plan(const DispatchPlan& plan, int64_t first, int64_t tokens);

// The token of each dispatched row (the index of the layer's row gathers and scatter-adds).
std::vector<int32_t> dispatched_tokens(const DispatchPlan& plan);

// Host references of the layer's device gathers: out[r] = x[token of order[r]] ([rows, width]).
void permute_rows(float* out, const float* x, const DispatchPlan& plan, int64_t width);
// out[token of order[r]] += scale[order[r]] * rows[r] (scale null: 1).
void unpermute_rows(float* out, const float* rows, const DispatchPlan& plan, const float* scale, int64_t width);

// The exchange between `peers` expert-parallel ranks, each holding `local` experts.
struct ExchangePlan {
  int peers = 1, local = 0;
  std::vector<int64_t> send_rows;    // [peers]: rows sent to each peer (its experts' rows, in order)
  std::vector<int64_t> recv_counts;  // [peers * local]: rows from peer p for local expert j
  std::vector<int64_t> recv_rows;    // [peers]
  std::vector<int64_t> expert_rows;  // [local]: rows each local expert computes
  int64_t received = 0;
};

// send counts per (peer, local expert) from a plan, for exchange_counts.
std::vector<int64_t> send_counts_by_expert(const DispatchPlan& plan, int peers);
ExchangePlan make_exchange_plan(const DispatchPlan& plan, int peers, const std::vector<int64_t>& recv_counts);

// Received rows are peer-major (peer, then expert); experts compute expert-major (expert, then
// peer). to_expert_major moves rows one way, the reverse the other (block copies on `device`).
void regroup_rows(Device device, float* out, const float* in, const ExchangePlan& plan, int64_t width,
                  bool to_expert_major);

}  // namespace loom::model
