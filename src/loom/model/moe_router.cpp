#include "loom/model/moe_router.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/router_scores.h"

namespace loom::model {

namespace {

using kernels::log_sum_exp;
using kernels::softmax_row;

// The k largest entries of v, largest first; ties take the lower index.
void select_top_k(const std::vector<float>& v, int k, int32_t* out) {
  for (int i = 0; i < k; ++i) {
    int best = -1;
    for (int e = 0; e < static_cast<int>(v.size()); ++e) {
      if (std::find(out, out + i, e) != out + i) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    out[i] = best;
  }
}

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

void MoeRouter::forward(Routing& r, const float* x, int64_t tokens, int64_t seq, const float* weight,
                        const float* bias, ExpertComm* comm) const {
  const int E = experts_, k = top_k_;
  const float scale = static_cast<float>(moe_.topk_scaling);
  r.tokens = tokens;
  r.seq = seq;
  float* device_logits = sized(r.logits, tokens * E, device_);
  // fp32 whatever the recipe.
  kernels::linear_forward(device_, device_logits, x, weight, nullptr, tokens, d_model_, E);
  r.host_logits.resize(tokens * E);
  copy_to_host(device_, r.host_logits.data(), device_logits, tokens * E);
  const float* logits = r.host_logits.data();
  r.scores.resize(tokens * E);
  r.expert.resize(tokens * k);
  r.weight.resize(tokens * k);
  r.counts.assign(E, 0.0f);
  std::vector<float> select(E);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    float* s = r.scores.data() + t * E;
    kernels::router_scores(router_kind(moe_.router), l, s, E);  // as the backward recomputes them
    for (int e = 0; e < E; ++e) {
      select[e] = (moe_.router == config::MoeRouter::TopkSoftmax ? l[e] : s[e]) + (bias ? bias[e] : 0.0f);
    }
    int32_t* ex = r.expert.data() + t * k;
    float* w = r.weight.data() + t * k;
    select_top_k(select, k, ex);
    if (moe_.router == config::MoeRouter::TopkSoftmax) {
      float picked[64];
      LOOM_CHECK(k <= 64, "model.moe_top_k above 64 is not supported");
      for (int i = 0; i < k; ++i) picked[i] = l[ex[i]];
      softmax_row(picked, w, k);
    } else {
      double sum = 0.0;
      for (int i = 0; i < k; ++i) sum += w[i] = s[ex[i]];
      if (moe_.router == config::MoeRouter::Sigmoid) {
        for (int i = 0; i < k; ++i) w[i] = static_cast<float>(w[i] / sum);
      }
    }
    for (int i = 0; i < k; ++i) {
      w[i] *= scale;
      r.counts[ex[i]] += 1.0f;
    }
  }
  r.z_loss = 0.0;
  if (moe_.z_loss_coeff > 0.0) {
    double sum = 0.0;
    for (int64_t t = 0; t < tokens; ++t) {
      const double lse = log_sum_exp(logits + t * E, E);
      sum += lse * lse;
    }
    r.z_loss = moe_.z_loss_coeff * sum / static_cast<double>(tokens);
  }
  balancing_loss(r, comm);
  // What the backward reads where the logits are (kernels::moe_router_backward): no read back.
  upload(device_, r.expert_on_device, r.expert);
  upload(device_, r.weight_on_device, r.weight);
  upload(device_, r.aux_f_on_device, r.aux_f);
  upload(device_, r.aux_factor_on_device, r.aux_factor);
}

// Switch/Megatron load balancing: coeff * E / k * sum_e f_e * P_e with f_e the selections of
// expert e over the group's tokens and P_e the mean routing probability (sigmoid scores
// normalised per token). Per sequence: the mean of each sequence's loss. Global: f summed over
// every routing rank (the gradient flows through this rank's probabilities only).
void MoeRouter::balancing_loss(Routing& r, ExpertComm* comm) const {
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
  std::vector<double> probs(E);
  for (int64_t g = 0; g < groups; ++g) {
    const double factor = moe_.aux_loss_coeff * E / (top_k_ * f_tokens * static_cast<double>(group_tokens)) /
                          static_cast<double>(groups);
    r.aux_factor.push_back(factor);
    std::fill(probs.begin(), probs.end(), 0.0);
    for (int64_t t = g * group_tokens; t < (g + 1) * group_tokens; ++t) {
      const float* s = r.scores.data() + t * E;
      double norm = 1.0;
      if (moe_.router == config::MoeRouter::Sigmoid) {
        norm = 0.0;
        for (int e = 0; e < E; ++e) norm += s[e];
      }
      for (int e = 0; e < E; ++e) probs[e] += s[e] / norm;
    }
    for (int e = 0; e < E; ++e) r.aux_loss += factor * probs[e] * r.aux_f[g * E + e];
  }
}

void MoeRouter::backward(float* d_logits, const Routing& r, const int32_t* selection_row, const double* row_grad,
                         float aux_scale, int64_t first, int64_t end) const {
  kernels::RouterBackward b;
  b.kind = router_kind(moe_.router);
  b.experts = experts_;
  b.top_k = top_k_;
  b.topk_scaling = static_cast<float>(moe_.topk_scaling);
  b.tokens = r.tokens;
  b.logits = r.logits.data();
  b.expert = r.expert_on_device.data();
  b.weight = r.weight_on_device.data();
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
