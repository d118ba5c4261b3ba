#include "loom/kernels/attention_operands.h"

#include <algorithm>
#include <cstdint>

namespace loom::kernels {

namespace {

// Element distance from a to b (b - a), as integers: the views may lie in different allocations.
int64_t distance(const float* a, const float* b) {
  return (static_cast<int64_t>(reinterpret_cast<uintptr_t>(b)) - static_cast<int64_t>(reinterpret_cast<uintptr_t>(a))) /
         static_cast<int64_t>(sizeof(float));
}

bool same_rows(const OperandView& a, const OperandRegion& r) {
  if (a.rows != r.rows || a.stride != r.stride || a.rows == 0) return false;
  const int64_t from = distance(r.base, a.data);
  const int64_t lo = std::min<int64_t>(0, from), hi = std::max(r.span, from + a.width);
  return hi - lo <= r.stride;
}

}  // namespace

OperandLayout share_regions(const std::vector<OperandView>& views) {
  OperandLayout layout;
  for (const OperandView& v : views) {
    auto it = std::find_if(layout.regions.begin(), layout.regions.end(),
                           [&](const OperandRegion& r) { return same_rows(v, r); });
    if (it == layout.regions.end()) {
      layout.regions.push_back({v.data, v.rows, v.width, v.stride});
      layout.region_of.push_back(static_cast<int>(layout.regions.size()) - 1);
      continue;
    }
    const int64_t from = distance(it->base, v.data);
    if (from < 0) {  // the view starts before the region: move the region's base back
      it->span -= from;
      it->base = v.data;
    } else {
      it->span = std::max(it->span, from + v.width);
    }
    layout.region_of.push_back(static_cast<int>(it - layout.regions.begin()));
  }
  for (size_t i = 0; i < views.size(); ++i) {
    layout.offset_of.push_back(distance(layout.regions[static_cast<size_t>(layout.region_of[i])].base, views[i].data));
  }
  return layout;
}

std::vector<OperandView> attention_views(const FlashAttentionShape& s, const float* q, const float* k,
                                         const float* v) {
  return {{q, s.batch * s.q_len, s.heads * s.head_dim, s.q_stride},
          {k, s.batch * s.k_len, s.kv_heads * s.head_dim, s.k_stride},
          {v, s.batch * s.k_len, s.kv_heads * s.head_dim, s.v_stride}};
}

OperandView attention_output_view(const FlashAttentionShape& s, const float* out) {
  return {out, s.batch * s.q_len, s.heads * s.head_dim, s.out_stride};
}

}  // namespace loom::kernels
