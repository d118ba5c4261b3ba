#pragma once
// The MoE router of one routing group (the tokens of a micro-batch on this rank): logits = x W^T
// in fp32, top-k selection (the expert bias, when given, added for selection only), the
// combine weights, and the auxiliary losses (load balancing, z-loss), forward and backward.
//   topk_softmax: weights = softmax over the k selected logits (Megatron's default)
//   softmax_topk: weights = softmax over every expert, at the k selected
//   sigmoid:      weights = sigmoid scores of the k selected, normalised over them
// each times model.moe_topk_scaling. Ties pick the lower expert index.
// The logits are computed where the model lives, and so are the selections, combine weights and
// the losses' sums (kernels::moe_router_forward), which the host reads back in one copy ([tokens, k]
// selections and weights, not [tokens, E] logits) for the routing decisions that follow (capacity,
// the dispatch plan, the losses); the CPU runs the same kernel. The logits' gradient is computed
// where they live too (kernels::moe_router_backward, which recomputes the scores from them) from
// the selections and weights left there: the backward reads nothing back.
#include <cstdint>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/core/device.h"
#include "loom/kernels/types.h"
#include "loom/model/buffers.h"
#include "loom/model/expert_comm.h"

namespace loom::model {

struct Routing {
  int64_t tokens = 0, seq = 0;
  Buffer logits;                // [tokens, E] on the model's device
  std::vector<int32_t> expert;  // [tokens, k]: the selected experts
  std::vector<float> weight;    // [tokens, k]: their combine weights
  std::vector<float> counts;    // [E]: selections per expert in the group (before any drop)
  // The load-balancing loss per balancing group g: factor[g] * sum_e P[g, e] * f[g * E + e].
  std::vector<float> aux_f;
  std::vector<double> aux_factor;
  double aux_loss = 0.0, z_loss = 0.0;  // including their coefficients
  // On the model's device: the selections, weights, log-sum-exps and score sums the forward
  // kernel wrote (one buffer, read back at once into host_selections), the expert bias it read, and
  // aux_f and aux_factor for the backward.
  DeviceBuffer<double> selections_on_device;
  std::vector<double> host_selections;
  Buffer bias_on_device, aux_f_on_device;
  DeviceBuffer<double> aux_factor_on_device;
  const int32_t* device_expert() const { return reinterpret_cast<const int32_t*>(selections_on_device.data()); }
  const float* device_weight() const { return reinterpret_cast<const float*>(device_expert() + expert.size()); }
};

class MoeRouter {
 public:
  MoeRouter(const config::MoeConfig& moe, Device device, int experts, int64_t d_model);
  int experts() const { return experts_; }
  int top_k() const { return top_k_; }

  // x: [tokens, d_model] (all the group's tokens); bias: [E] or null. `seq`: tokens per sequence
  // (the per-sequence loss). `comm` (may be null): a global loss sums the counts over it.
  void forward(Routing& r, const float* x, int64_t tokens, int64_t seq, const float* weight, const float* bias,
               ExpertComm* comm) const;
  // d_logits [tokens, E] (on the model's device, written whole) = the gradient of
  // sum(d_weight . weight) + aux_scale * (aux + z loss), where selection t * k + i's d_weight is
  // float(row_grad[selection_row[t * k + i]]) (-1: dropped, 0); both arrays on the model's device.
  // The losses' part only for rows [first, end) (the rows this rank owns under sequence parallelism).
  void backward(float* d_logits, const Routing& r, const int32_t* selection_row, const double* row_grad,
                float aux_scale, int64_t first, int64_t end) const;

 private:
  // The router's kind, sizes and scaling for its kernels over `tokens` tokens.
  kernels::RouterShape shape(int64_t tokens) const;
  // aux_loss and its gradient's factors from the selections and prob_sums [groups, E] (the
  // forward kernel's sums of each group's normalised scores).
  void balancing_loss(Routing& r, ExpertComm* comm, const double* prob_sums) const;

  config::MoeConfig moe_;
  Device device_;
  int experts_, top_k_;
  int64_t d_model_;
};

}  // namespace loom::model
