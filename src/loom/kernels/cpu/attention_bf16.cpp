#include "loom/kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <vector>

#include "loom/core/dtype_convert.h"
#include "loom/kernels/attention_operands.h"
#include "loom/kernels/cpu/amax.h"
#include "loom/kernels/cpu/flash_attention.h"
#include "loom/kernels/cpu/half_copies.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/rope.h"

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
// A bf16 view [rows, width] every `stride` elements, widened into fp32 at the same offsets (the
// last row needs only its width).
std::vector<float> widened(const void* x16, int64_t rows, int64_t width, int64_t stride) {
  std::vector<float> x(static_cast<size_t>(rows == 0 ? 0 : (rows - 1) * stride + width));
  const auto* h = static_cast<const uint16_t*>(x16);
  for (int64_t row = 0; row < rows; ++row)
    widen_floats(x.data() + row * stride, h + row * stride, width, DType::BF16, false);
  return x;
}

// q, k, v of a call widened.
struct WidenedOperands {
  WidenedOperands(const FlashAttentionShape& s, const void* q16, const void* k16, const void* v16)
      : q(widened(q16, s.batch * s.q_len, s.heads * s.head_dim, s.q_stride)),
        k(widened(k16, s.batch * s.k_len, s.kv_heads * s.head_dim, s.k_stride)),
        v(widened(v16, s.batch * s.k_len, s.kv_heads * s.head_dim, s.v_stride)) {}
  std::vector<float> q, k, v;
};
}  // namespace

void flash_attention_forward_bf16_tensors(void* out16, float* lse, const void* q16, const void* k16, const void* v16,
                                          const FlashAttentionShape& s, const AttentionVisibility& vis) {
  const WidenedOperands in(s, q16, k16, v16);
  const OperandView o = attention_output_view(s, nullptr);
  std::vector<float> out(static_cast<size_t>(o.rows * o.stride));
  flash_attention_forward_bf16(out.data(), lse, in.q.data(), in.k.data(), in.v.data(), s, vis);
  auto* h = static_cast<uint16_t*>(out16);
  for (int64_t row = 0; row < o.rows; ++row)
    narrow_floats(h + row * o.stride, out.data() + row * o.stride, o.width, DType::BF16);
}

void flash_attention_backward_bf16_tensors(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                           const float* lse, const void* q16, const void* k16, const void* v16,
                                           const FlashAttentionShape& s, const AttentionVisibility& vis) {
  const WidenedOperands in(s, q16, k16, v16);
  const OperandView o = attention_output_view(s, nullptr);
  const std::vector<float> dout = widened(dout16, o.rows, o.width, o.stride);
  const std::vector<float> out = widened(out16, o.rows, o.width, o.stride);
  flash_attention_backward_bf16(dq, dk, dv, dout.data(), out.data(), lse, in.q.data(), in.k.data(), in.v.data(), s,
                                vis);
}

void flash_attention_backward_bf16_gradients(void* dq16, void* dk16, void* dv16, float* dbias_q, float* dbias_k,
                                             float* dbias_v, const void* dout16, const void* out16, const float* lse,
                                             const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const QkvRotation& rotation) {
  // Each gradient's view [rows, width] every `stride` elements, as q, k, v lie.
  struct Gradient {
    void* out16;
    float* dbias;
    int64_t rows, width, stride;
    std::vector<float> fp32;  // zeroed, in the view's layout
  };
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len, kv_width = s.kv_heads * s.head_dim;
  Gradient g[3] = {{dq16, dbias_q, q_rows, s.heads * s.head_dim, s.q_stride, {}},
                   {dk16, dbias_k, k_rows, kv_width, s.k_stride, {}},
                   {dv16, dbias_v, k_rows, kv_width, s.v_stride, {}}};
  for (Gradient& x : g) x.fp32.assign(static_cast<size_t>(x.rows == 0 ? 0 : (x.rows - 1) * x.stride + x.width), 0.0f);
  flash_attention_backward_bf16_tensors(g[0].fp32.data(), g[1].fp32.data(), g[2].fp32.data(), dout16, out16, lse, q16,
                                        k16, v16, s, vis);
  if (rotation.table != nullptr) {
    rope_backward(g[0].fp32.data(), q_rows, s.q_stride, 0, s.heads, rotation.seq, 0, *rotation.table,
                  rotation.positions);
    rope_backward(g[1].fp32.data(), k_rows, s.k_stride, 0, s.kv_heads, rotation.seq, 0, *rotation.table,
                  rotation.positions);
  }
  for (Gradient& x : g) {
    auto* h = static_cast<uint16_t*>(x.out16);
    std::vector<float> rows(static_cast<size_t>(x.dbias != nullptr ? x.rows * x.width : 0));
    for (int64_t row = 0; row < x.rows; ++row) {
      const float* from = x.fp32.data() + row * x.stride;
      narrow_floats(h + row * x.stride, from, x.width, DType::BF16);
      if (x.dbias != nullptr) std::copy(from, from + x.width, rows.begin() + row * x.width);
    }
    if (x.dbias != nullptr) add_column_sums(x.dbias, rows.data(), x.rows, x.width);
  }
}

void flash_attention_backward_fp32_gradients(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                             const float* lse, const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const QkvRotation& rotation, float* amax) {
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len, kv_width = s.kv_heads * s.head_dim;
  auto zero_view = [](float* x, int64_t rows, int64_t width, int64_t stride) {
    for (int64_t r = 0; r < rows; ++r) std::fill(x + r * stride, x + r * stride + width, 0.0f);
  };
  zero_view(dq, q_rows, s.heads * s.head_dim, s.q_stride);
  zero_view(dk, k_rows, kv_width, s.k_stride);
  zero_view(dv, k_rows, kv_width, s.v_stride);
  flash_attention_backward_bf16_tensors(dq, dk, dv, dout16, out16, lse, q16, k16, v16, s, vis);
  if (rotation.table != nullptr) {
    rope_backward(dq, q_rows, s.q_stride, 0, s.heads, rotation.seq, 0, *rotation.table, rotation.positions);
    rope_backward(dk, k_rows, s.k_stride, 0, s.kv_heads, rotation.seq, 0, *rotation.table, rotation.positions);
  }
  if (amax == nullptr) return;
  auto view_amax = [&](const float* x, int64_t rows, int64_t width, int64_t stride) {
    for (int64_t r = 0; r < rows; ++r) amax_into(amax, x + r * stride, width);
  };
  view_amax(dq, q_rows, s.heads * s.head_dim, s.q_stride);
  view_amax(dk, k_rows, kv_width, s.k_stride);
  view_amax(dv, k_rows, kv_width, s.v_stride);
}

}  // namespace loom::kernels::cpu
