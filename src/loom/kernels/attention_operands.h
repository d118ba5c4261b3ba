#pragma once
// Where attention's bf16 operands go (AttentionOperands::Bf16): the strided views q, k, v (views
// of one fused qkv, or of separate buffers) and out, dout are copied row by row into narrow
// buffers that keep every view's offset and stride, so the kernels take the copies with the same
// FlashAttentionShape. Views that lie in the same rows of one buffer (q, k, v of a fused qkv) share
// one copy of the columns they cover.
#include <cstdint>
#include <vector>

#include "loom/kernels/types.h"

namespace loom::kernels {

// rows x width elements at data, row r at data + r * stride.
struct OperandView {
  const float* data;
  int64_t rows, width, stride;
};

// Columns [0, span) of `rows` rows from `base`, every `stride` elements: one copy.
struct OperandRegion {
  const float* base;
  int64_t rows, span, stride;
  // The copy's length: the last row needs only its span.
  int64_t elements() const { return rows == 0 ? 0 : (rows - 1) * stride + span; }
};

struct OperandLayout {
  std::vector<OperandRegion> regions;
  std::vector<int> region_of;       // per view
  std::vector<int64_t> offset_of;   // per view: its first element's offset in its region's copy
};

// Groups the views: two share a region when they have the same rows and stride and lie within
// one stride of each other (columns of the same rows). Empty views get a region of their own.
OperandLayout share_regions(const std::vector<OperandView>& views);

// The views of one call: q, k, v, then (backward) out and dout, as `s` lays them out.
std::vector<OperandView> attention_views(const FlashAttentionShape& s, const float* q, const float* k,
                                         const float* v);
OperandView attention_output_view(const FlashAttentionShape& s, const float* out);

}  // namespace loom::kernels
