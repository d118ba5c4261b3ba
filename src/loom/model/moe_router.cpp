#include "loom/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::model {

namespace {

kernels::RouterKind router_kind(config::MoeRouter router) {
  switch (router) {
    case config::MoeRouter::SoftmaxTopk: return kernels::RouterKind::SoftmaxTopk;
    case config::MoeRouter::Sigmoid: return kernels::RouterKind::Sigmoid;
    default: return kernels::RouterKind::TopkSoftmax;
  }
}

}  // namespace

MoeRouter::MoeRouter(const config::MoeConfig& moe, Device device, int experts, int64_t d_model)
    : moe_(moe), device_(device), experts_(experts), top_k_(moe.top_k), d_model_(d_model) {}

kernels::RouterShape MoeRouter::shape(int64_t tokens) const {
  return {router_kind(moe_.router), experts_, top_k_, static_cast<float>(moe_.topk_scaling), tokens};
}

void MoeRouter::forward(Routing& r, const float* x, int64_t tokens, int64_t seq, const float* weight,
                        const float* bias, ExpertComm* comm) const {
  const int E = experts_, k = top_k_;
  r.tokens = tokens;
  r.seq = seq;
  float* device_logits = sized(r.logits, tokens * E, device_);
  // fp32 whatever the recipe.
  kernels::linear_forward(device_, device_logits, x, weight, nullptr, tokens, d_model_, E);
  // The selections and weights, the logits' log-sum-exps (z-loss) and the groups' score sums
  // (balancing loss) computed where the logits are, into one buffer read back at once.
  const bool z_loss = moe_.z_loss_coeff > 0.0, balancing = moe_.aux_loss_coeff > 0.0;
  const int64_t group_tokens = moe_.aux_loss == config::MoeAuxLoss::Sequence ? seq : tokens;
  const int64_t groups = group_tokens > 0 ? tokens / group_tokens : 0, selections = tokens * k;
  const int64_t total = selections + (z_loss ? tokens : 0) + (balancing ? groups * E : 0);  // in 8-byte units
  double* packed = sized(r.selections_on_device, total, device_);
  kernels::RouterForward f;
  static_cast<kernels::RouterShape&>(f) = shape(tokens);
  f.logits = device_logits;
  if (bias != nullptr) f.bias = upload(device_, r.bias_on_device, bias, E);
  f.expert = reinterpret_cast<int32_t*>(packed);
  f.weight = reinterpret_cast<float*>(f.expert + selections);
  f.lse = z_loss ? packed + selections : nullptr;
  f.prob_sums = balancing ? packed + selections + (z_loss ? tokens : 0) : nullptr;
  f.group_tokens = group_tokens;
  kernels::moe_router_forward(device_, f);
  std::vector<double>& host = r.host_selections;
  host.resize(static_cast<size_t>(total));
  copy_to_host(device_, host.data(), packed, total);
  r.expert.resize(selections);
  r.weight.resize(selections);
  std::memcpy(r.expert.data(), host.data(), selections * sizeof(int32_t));
  std::memcpy(r.weight.data(), reinterpret_cast<const int32_t*>(host.data()) + selections, selections * sizeof(float));
  r.counts.assign(E, 0.0f);
  for (const int32_t e : r.expert) r.counts[e] += 1.0f;
  r.z_loss = 0.0;
  if (z_loss) {
    double sum = 0.0;
    for (int64_t t = 0; t < tokens; ++t) sum += host[selections + t] * host[selections + t];
    r.z_loss = moe_.z_loss_coeff * sum / static_cast<double>(tokens);
  }
  balancing_loss(r, comm, balancing ? host.data() + selections + (z_loss ? tokens : 0) : nullptr);
  // What the backward reads besides the selections and weights, where the logits are
  // (kernels::moe_router_backward): no read back there.
  upload(device_, r.aux_f_on_device, r.aux_f);
  upload(device_, r.aux_factor_on_device, r.aux_factor);
}

// Switch/Megatron load balancing: coeff * E / k * sum_e f_e * P_e with f_e the selections of
// expert e over the group's tokens and P_e the mean routing probability (sigmoid scores
// normalised per token). Per sequence: the mean of each sequence's loss. Global: f summed over
// every routing rank (the gradient flows through this rank's probabilities only).
void MoeRouter::balancing_loss(Routing& r, ExpertComm* comm, const double* prob_sums) const {
  r.aux_f.clear();
  r.aux_factor.clear();
  r.aux_loss = 0.0;
  if (moe_.aux_loss_coeff <= 0.0) return;
  const int E = experts_;
  const int64_t T = r.tokens;
  const bool per_sequence = moe_.aux_loss == config::MoeAuxLoss::Sequence;
  const int64_t group_tokens = per_sequence ? r.seq : T, groups = T / group_tokens;
  r.aux_f.assign(groups * E, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < top_k_; ++i) r.aux_f[(t / group_tokens) * E + r.expert[t * top_k_ + i]] += 1.0f;
  }
  double f_tokens = static_cast<double>(group_tokens);
  if (moe_.aux_loss == config::MoeAuxLoss::Global && comm != nullptr) {
    std::vector<float> sums(r.aux_f);
    sums.push_back(static_cast<float>(T));
    comm->sum_over_routing_ranks(sums.data(), static_cast<int64_t>(sums.size()));
    std::copy(sums.begin(), sums.begin() + E, r.aux_f.begin());
    f_tokens = sums[E];
  }
  for (int64_t g = 0; g < groups; ++g) {
    const double factor = moe_.aux_loss_coeff * E / (top_k_ * f_tokens * static_cast<double>(group_tokens)) /
                          static_cast<double>(groups);
    r.aux_factor.push_back(factor);
    const double* probs = prob_sums + g * E;  // the group's tokens' normalised scores, summed
    for (int e = 0; e < E; ++e) r.aux_loss += factor * probs[e] * r.aux_f[g * E + e];
  }
}

void MoeRouter::backward(float* d_logits, const Routing& r, const int32_t* selection_row, const double* row_grad,
                         float aux_scale, int64_t first, int64_t end) const {
  kernels::RouterBackward b;
  static_cast<kernels::RouterShape&>(b) = shape(r.tokens);
  b.logits = r.logits.data();
  b.expert = r.device_expert();
  b.weight = r.device_weight();
  b.selection_row = selection_row;
  b.row_grad = row_grad;
  if (!r.aux_factor.empty()) {
    b.aux_f = r.aux_f_on_device.data();
    b.aux_factor = r.aux_factor_on_device.data();
    b.group_tokens = moe_.aux_loss == config::MoeAuxLoss::Sequence ? r.seq : r.tokens;
  }
  b.z_loss_coeff = moe_.z_loss_coeff;
  b.aux_scale = aux_scale;
  b.first = first;
  b.end = end;
  kernels::moe_router_backward(device_, d_logits, b);
}

}  // namespace loom::model
