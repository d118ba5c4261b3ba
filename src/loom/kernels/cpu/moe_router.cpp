#include "loom/kernels/cpu/moe_router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/router_scores.h"

namespace loom::kernels::cpu {

namespace {

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

// w [k] = the combine weights of the selected experts ex from the token's logits l and scores s
// (`picked`: room for k values).
void combine_weights(const RouterForward& r, const float* l, const float* s, const int32_t* ex, float* w,
                     float* picked) {
  const int k = r.top_k;
  if (r.kind == RouterKind::TopkSoftmax) {
    for (int i = 0; i < k; ++i) picked[i] = l[ex[i]];
    softmax_row(picked, w, k);
  } else {
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += w[i] = s[ex[i]];
    if (r.kind == RouterKind::Sigmoid) {
      for (int i = 0; i < k; ++i) w[i] = static_cast<float>(w[i] / sum);
    }
  }
  for (int i = 0; i < k; ++i) w[i] *= r.topk_scaling;
}

// dl += the gradient of sum_i dw[i] * weight[i] of one token.
void weights_backward(float* dl, const RouterBackward& r, const float* s, const int32_t* ex, const float* w,
                      const float* dw) {
  const int E = r.experts, k = r.top_k;
  const float scale = r.topk_scaling;
  if (r.kind == RouterKind::TopkSoftmax) {
    double dot = 0.0;
    for (int i = 0; i < k; ++i) dot += (w[i] / scale) * (dw[i] * scale);
    for (int i = 0; i < k; ++i) dl[ex[i]] += (w[i] / scale) * static_cast<float>(dw[i] * scale - dot);
  } else if (r.kind == RouterKind::SoftmaxTopk) {
    double dot = 0.0;
    for (int i = 0; i < k; ++i) dot += s[ex[i]] * dw[i] * scale;
    for (int e = 0; e < E; ++e) dl[e] -= s[e] * static_cast<float>(dot);
    for (int i = 0; i < k; ++i) dl[ex[i]] += s[ex[i]] * dw[i] * scale;
  } else {
    double sum = 0.0, dot = 0.0;
    for (int i = 0; i < k; ++i) {
      sum += s[ex[i]];
      dot += dw[i] * s[ex[i]];
    }
    for (int i = 0; i < k; ++i) {
      const double ds = scale * (dw[i] / sum - dot / (sum * sum));
      dl[ex[i]] += static_cast<float>(ds * s[ex[i]] * (1.0 - s[ex[i]]));
    }
  }
}

// dl += aux_scale times the gradient of token t's share of the balancing loss and the z-loss.
void losses_backward(float* dl, const RouterBackward& r, int64_t t, const float* s, const float* l) {
  const int E = r.experts;
  if (r.aux_f != nullptr) {
    const int64_t g = t / r.group_tokens;
    const double factor = r.aux_scale * r.aux_factor[g];
    const float* f = r.aux_f + g * E;
    double norm = 1.0;
    if (r.kind == RouterKind::Sigmoid) {
      norm = 0.0;
      for (int e = 0; e < E; ++e) norm += s[e];
    }
    double dot = 0.0;  // sum_e q_e dq_e with q the normalised scores
    for (int e = 0; e < E; ++e) dot += s[e] / norm * factor * f[e];
    for (int e = 0; e < E; ++e) {
      const double dq = factor * f[e];
      if (r.kind == RouterKind::Sigmoid) {
        dl[e] += static_cast<float>((dq - dot) / norm * s[e] * (1.0 - s[e]));
      } else {
        dl[e] += static_cast<float>(s[e] * (dq - dot));
      }
    }
  }
  if (r.z_loss_coeff > 0.0) {
    const double lse = log_sum_exp(l, E);
    const double c = r.aux_scale * r.z_loss_coeff * 2.0 * lse / static_cast<double>(r.tokens);
    for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(c * std::exp(static_cast<double>(l[e]) - lse));
  }
}

}  // namespace

void sigmoid_gate(float* gate, const double* logits, int64_t n) {
  for (int64_t t = 0; t < n; ++t) gate[t] = static_cast<float>(1.0 / (1.0 + std::exp(-logits[t])));
}

void sigmoid_gate_backward(float* d_logit, const double* dots, const float* gate, int64_t n) {
  for (int64_t t = 0; t < n; ++t) d_logit[t] = static_cast<float>(dots[t]) * gate[t] * (1.0f - gate[t]);
}

void moe_router_forward(const RouterForward& r) {
  const int E = r.experts, k = r.top_k;
  std::vector<float> scores(static_cast<size_t>(E)), select(static_cast<size_t>(E)), picked(static_cast<size_t>(k));
  if (r.prob_sums != nullptr) std::fill_n(r.prob_sums, r.tokens / r.group_tokens * E, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float* l = r.logits + t * E;
    const float* s = scores.data();
    router_scores(r.kind, l, scores.data(), E);
    for (int e = 0; e < E; ++e) {
      select[e] = (r.kind == RouterKind::TopkSoftmax ? l[e] : s[e]) + (r.bias ? r.bias[e] : 0.0f);
    }
    int32_t* ex = r.expert + t * k;
    select_top_k(select, k, ex);
    combine_weights(r, l, s, ex, r.weight + t * k, picked.data());
    if (r.lse != nullptr) r.lse[t] = log_sum_exp(l, E);
    if (r.prob_sums != nullptr) {
      double norm = 1.0;
      if (r.kind == RouterKind::Sigmoid) {
        norm = 0.0;
        for (int e = 0; e < E; ++e) norm += s[e];
      }
      double* p = r.prob_sums + t / r.group_tokens * E;
      for (int e = 0; e < E; ++e) p[e] += s[e] / norm;
    }
  }
}

void moe_router_backward(float* d_logits, const RouterBackward& r) {
  const int E = r.experts, k = r.top_k;
  std::vector<float> scores(static_cast<size_t>(E)), dw(static_cast<size_t>(k));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float* l = r.logits + t * E;
    float* dl = d_logits + t * E;
    std::fill(dl, dl + E, 0.0f);
    router_scores(r.kind, l, scores.data(), E);
    for (int i = 0; i < k; ++i) {
      const int32_t row = r.selection_row[t * k + i];
      dw[i] = row < 0 ? 0.0f : static_cast<float>(r.row_grad[row]);
    }
    weights_backward(dl, r, scores.data(), r.expert + t * k, r.weight + t * k, dw.data());
    if (t >= r.first && t < r.end) losses_backward(dl, r, t, scores.data(), l);
  }
}

}  // namespace loom::kernels::cpu
