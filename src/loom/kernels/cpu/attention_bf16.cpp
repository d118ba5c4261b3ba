#include "loom/kernels/cpu/attention_bf16.h"

#include <vector>

#include "loom/core/dtype_convert.h"
#include "loom/kernels/attention_operands.h"
#include "loom/kernels/cpu/flash_attention.h"
#include "loom/kernels/cpu/parallel.h"

namespace loom::kernels::cpu {

namespace {

float rounded(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Rounded copies of the views' regions; pointer(i) is view i within its copy.
class RoundedViews {
 public:
  explicit RoundedViews(const std::vector<OperandView>& views) : layout_(share_regions(views)) {
    for (const OperandRegion& r : layout_.regions) {
      std::vector<float>& copy = copies_.emplace_back(static_cast<size_t>(r.elements()));
#pragma omp parallel for schedule(static) if (worth_parallel(r.rows * r.span))
      for (int64_t row = 0; row < r.rows; ++row) {
        const float* src = r.base + row * r.stride;
        float* dst = copy.data() + row * r.stride;
        for (int64_t c = 0; c < r.span; ++c) dst[c] = rounded(src[c]);
      }
    }
  }
  const float* pointer(size_t view) const {
    return copies_[static_cast<size_t>(layout_.region_of[view])].data() + layout_.offset_of[view];
  }

 private:
  OperandLayout layout_;
  std::vector<std::vector<float>> copies_;
};

}  // namespace

void flash_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis) {
  const RoundedViews in(attention_views(s, q, k, v));
  flash_attention_forward(out, lse, in.pointer(0), in.pointer(1), in.pointer(2), s, vis);
  const OperandView o = attention_output_view(s, out);
#pragma omp parallel for schedule(static) if (worth_parallel(o.rows * o.width))
  for (int64_t row = 0; row < o.rows; ++row) {
    float* x = out + row * o.stride;
    for (int64_t c = 0; c < o.width; ++c) x[c] = rounded(x[c]);
  }
}

void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis) {
  std::vector<OperandView> views = attention_views(s, q, k, v);
  views.push_back(attention_output_view(s, out));
  views.push_back(attention_output_view(s, dout));
  const RoundedViews in(views);
  flash_attention_backward(dq, dk, dv, in.pointer(4), in.pointer(3), lse, in.pointer(0), in.pointer(1), in.pointer(2),
                           s, vis);
}

namespace {
// An output view's rows [rows, stride] (its span) between fp32 and bf16 (2-byte elements).
std::vector<float> widened(const FlashAttentionShape& s, const void* x16) {
  const OperandView o = attention_output_view(s, nullptr);
  std::vector<float> x(static_cast<size_t>(o.rows * o.stride));
  const auto* h = static_cast<const uint16_t*>(x16);
  for (int64_t row = 0; row < o.rows; ++row) {
    for (int64_t c = 0; c < o.width; ++c) x[row * o.stride + c] = bf16_to_f32(h[row * o.stride + c]);
  }
  return x;
}
}  // namespace

void flash_attention_forward_bf16_output(void* out16, float* lse, const float* q, const float* k, const float* v,
                                         const FlashAttentionShape& s, const AttentionVisibility& vis) {
  const OperandView o = attention_output_view(s, nullptr);
  std::vector<float> out(static_cast<size_t>(o.rows * o.stride));
  flash_attention_forward_bf16(out.data(), lse, q, k, v, s, vis);
  auto* h = static_cast<uint16_t*>(out16);
  for (int64_t row = 0; row < o.rows; ++row) {
    for (int64_t c = 0; c < o.width; ++c) h[row * o.stride + c] = f32_to_bf16(out[row * o.stride + c]);
  }
}

void flash_attention_backward_bf16_output(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                          const float* lse, const float* q, const float* k, const float* v,
                                          const FlashAttentionShape& s, const AttentionVisibility& vis) {
  const std::vector<float> dout = widened(s, dout16), out = widened(s, out16);
  flash_attention_backward_bf16(dq, dk, dv, dout.data(), out.data(), lse, q, k, v, s, vis);
}

}  // namespace loom::kernels::cpu
