#include "loom/model/moe_dispatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/core/error.h"

namespace loom::model {

int64_t expert_capacity(int64_t tokens, int top_k, int experts, double capacity_factor) {
  if (capacity_factor <= 0.0) return 0;
  return static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / experts));
}

DispatchPlan plan_dispatch(const int32_t* expert, const float* weight, int64_t tokens, int top_k, int experts,
                           double capacity_factor, config::MoeDropPolicy policy) {
  DispatchPlan plan;
  plan.tokens = tokens;
  plan.top_k = top_k;
  plan.experts = experts;
  const int64_t selections = tokens * top_k;
  plan.kept.assign(selections, 1);
  // Selections per expert in token order.
  std::vector<std::vector<int64_t>> by_expert(experts);
  for (int64_t s = 0; s < selections; ++s) {
    LOOM_CHECK(expert[s] >= 0 && expert[s] < experts, "MoE dispatch: expert index out of range");
    by_expert[expert[s]].push_back(s);
  }
  const int64_t capacity = expert_capacity(tokens, top_k, experts, capacity_factor);
  plan.expert_rows.assign(experts, 0);
  for (int e = 0; e < experts; ++e) {
    std::vector<int64_t>& list = by_expert[e];
    if (capacity > 0 && static_cast<int64_t>(list.size()) > capacity) {
      std::vector<int64_t> ranked = list;
      if (policy == config::MoeDropPolicy::Probs) {
        std::stable_sort(ranked.begin(), ranked.end(), [&](int64_t a, int64_t b) { return weight[a] > weight[b]; });
      }
      for (size_t i = static_cast<size_t>(capacity); i < ranked.size(); ++i) plan.kept[ranked[i]] = 0;
      plan.dropped += static_cast<int64_t>(ranked.size()) - capacity;
      list.erase(std::remove_if(list.begin(), list.end(), [&](int64_t s) { return plan.kept[s] == 0; }), list.end());
    }
    plan.expert_rows[e] = static_cast<int64_t>(list.size());
    plan.order.insert(plan.order.end(), list.begin(), list.end());
  }
  return plan;
}

DispatchPlan share_of_plan(const DispatchPlan& plan, int64_t first, int64_t tokens) {
  LOOM_CHECK(first >= 0 && tokens >= 0 && first + tokens <= plan.tokens,
             "share_of_plan: tokens [" + std::to_string(first) + ", " + std::to_string(first + tokens) +
                 ") are outside the plan's " + std::to_string(plan.tokens));
  const int64_t k = plan.top_k, begin = first * k, end = (first + tokens) * k;
  DispatchPlan share;
  share.tokens = tokens;
  share.top_k = plan.top_k;
  share.experts = plan.experts;
  share.expert_rows.assign(plan.expert_rows.size(), 0);
  share.kept.assign(plan.kept.begin() + begin, plan.kept.begin() + end);
  share.dropped = std::count(share.kept.begin(), share.kept.end(), uint8_t{0});
  int64_t row = 0;
  for (size_t e = 0; e < plan.expert_rows.size(); ++e) {
    for (int64_t n = 0; n < plan.expert_rows[e]; ++n, ++row) {
      const int64_t selection = plan.order[row];
      if (selection < begin || selection >= end) continue;
      share.order.push_back(selection - begin);
      ++share.expert_rows[e];
    }
  }
  return share;
}

std::vector<int32_t> dispatched_tokens(const DispatchPlan& plan) {
  std::vector<int32_t> tokens(plan.order.size());
  for (size_t r = 0; r < plan.order.size(); ++r) tokens[r] = static_cast<int32_t>(plan.order[r] / plan.top_k);
  return tokens;
}

void permute_rows(float* out, const float* x, const DispatchPlan& plan, int64_t width) {
  for (size_t r = 0; r < plan.order.size(); ++r) {
    const float* src = x + (plan.order[r] / plan.top_k) * width;
    std::copy(src, src + width, out + static_cast<int64_t>(r) * width);
  }
}

void unpermute_rows(float* out, const float* rows, const DispatchPlan& plan, const float* scale, int64_t width) {
  for (size_t r = 0; r < plan.order.size(); ++r) {
    const int64_t s = plan.order[r];
    float* dst = out + (s / plan.top_k) * width;
    const float* src = rows + static_cast<int64_t>(r) * width;
    const float w = scale ? scale[s] : 1.0f;
    for (int64_t c = 0; c < width; ++c) dst[c] += w * src[c];
  }
}

std::vector<int64_t> send_counts_by_expert(const DispatchPlan& plan, int peers) {
  LOOM_CHECK(plan.experts % peers == 0, "MoE dispatch: " + std::to_string(plan.experts) +
                                            " experts do not split over " + std::to_string(peers) + " ranks");
  return plan.expert_rows;  // expert e belongs to peer e / local, so this is already peer-major
}

ExchangePlan make_exchange_plan(const DispatchPlan& plan, int peers, const std::vector<int64_t>& recv_counts) {
  ExchangePlan x;
  x.peers = peers;
  x.local = plan.experts / peers;
  x.recv_counts = recv_counts;
  x.send_rows.assign(peers, 0);
  x.recv_rows.assign(peers, 0);
  x.expert_rows.assign(x.local, 0);
  for (int e = 0; e < plan.experts; ++e) x.send_rows[e / x.local] += plan.expert_rows[e];
  for (int p = 0; p < peers; ++p) {
    for (int j = 0; j < x.local; ++j) {
      x.recv_rows[p] += recv_counts[p * x.local + j];
      x.expert_rows[j] += recv_counts[p * x.local + j];
    }
  }
  x.received = std::accumulate(x.recv_rows.begin(), x.recv_rows.end(), int64_t{0});
  return x;
}

void regroup_rows(Device device, float* out, const float* in, const ExchangePlan& plan, int64_t width,
                  bool to_expert_major) {
  // Start of block (p, j) in the peer-major and in the expert-major layout.
  std::vector<int64_t> peer_major(plan.peers * plan.local), expert_major(plan.peers * plan.local);
  int64_t at = 0;
  for (int p = 0; p < plan.peers; ++p) {
    for (int j = 0; j < plan.local; ++j) {
      peer_major[p * plan.local + j] = at;
      at += plan.recv_counts[p * plan.local + j];
    }
  }
  at = 0;
  for (int j = 0; j < plan.local; ++j) {
    for (int p = 0; p < plan.peers; ++p) {
      expert_major[p * plan.local + j] = at;
      at += plan.recv_counts[p * plan.local + j];
    }
  }
  for (size_t b = 0; b < peer_major.size(); ++b) {
    const int64_t n = plan.recv_counts[b] * width;
    const int64_t from = (to_expert_major ? peer_major[b] : expert_major[b]) * width;
    const int64_t to = (to_expert_major ? expert_major[b] : peer_major[b]) * width;
    copy_on_device(device, out + to, in + from, n);
  }
}

}  // namespace loom::model
