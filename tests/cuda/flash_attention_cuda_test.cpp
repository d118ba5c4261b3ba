// The GPU flash attention against the CPU tiled kernel (same contract, kernels/ops.h): causal,
// GQA, packed documents with per-token positions, a block of keys unlike the queries (context
// parallelism), q/k/v as strided views of one fused qkv, head_dim 64, 128 and an odd one;
// forward out and LSE, backward adding into non-zero dq/dk/dv, and the merge of partials: fp32
// within 1e-5 relative. bf16 inputs (tensor cores at head_dim 64 and 128): out within 1e-2 of an
// fp64 reference on the same (bf16-rounded) inputs and of the CPU's kernel on every case above,
// gradients within 1e-2 of the CPU's, backward deterministic; the bf16 operands behind the fp32
// entries (casts on the device) against the CPU's emulation of them. Fresh random inputs, outputs
// poisoned. Skipped, saying why, without a GPU.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceArray;
using testing::DeviceFloats;
using testing::fresh_seed;
using testing::poison;
using testing::random_ids;
using testing::random_values;
using testing::relative_error;
using testing::to_bf16;
using testing::to_float;

struct Case {
  std::string name;
  int64_t batch, q_len, k_len, heads, kv_heads, head_dim;
  bool documents;   // packed documents: per-token doc ids and positions restarting per document
  bool key_block;   // keys are a later block of the sequence than the queries' first positions
};

// Per-token metadata of one side: positions (restarting at document starts when packed) and docs.
// Tokens [offset, offset + len) of rows of `total` tokens (the same cuts for both sides).
void metadata(const Case& c, int64_t len, int64_t offset, int64_t total, uint32_t seed, std::vector<int32_t>& pos,
              std::vector<int32_t>& doc) {
  pos.assign(c.batch * len, 0);
  doc.assign(c.batch * len, 0);
  const std::vector<int32_t> cuts = random_ids(seed, c.batch * total, 0, 40);
  for (int64_t b = 0; b < c.batch; ++b) {
    int32_t d = 0;
    for (int64_t t = 0; t < offset + len; ++t) {
      if (c.documents && t > 0 && cuts[b * total + t] == 0) ++d;
      if (t >= offset) {
        pos[b * len + t - offset] = static_cast<int32_t>(t);
        doc[b * len + t - offset] = d;
      }
    }
  }
}

class CudaFlashAttention : public testing::GpuTest<::testing::TestWithParam<Case>> {};

// One case's inputs: a fused qkv of the queries' tokens and one of the keys' (k and v at columns
// k_at and v_at; the same tokens when q_len == k_len and the keys are not another block), dout,
// non-zero gradients to add into, and each side's positions and documents. `bf16` rounds q, k, v
// and dout to bf16 (the bf16 kernels' inputs, exactly).
struct Inputs {
  Inputs(const Case& c, uint32_t seed, bool bf16)
      : width((c.heads + 2 * c.kv_heads) * c.head_dim),
        s{c.batch, c.q_len, c.k_len, c.heads, c.kv_heads, c.head_dim, width, width, width, c.heads * c.head_dim},
        k_at(c.heads * c.head_dim),
        v_at((c.heads + c.kv_heads) * c.head_dim),
        explicit_meta(c.documents || c.key_block) {
    auto draw = [&](uint32_t at, int64_t n) {
      std::vector<float> x = random_values(seed + at, n, 1.0f);
      return bf16 ? bf16_rounded(std::move(x)) : x;
    };
    q = draw(0, c.batch * c.q_len * width);
    kv = draw(1, c.batch * c.k_len * width);
    dout = draw(2, c.batch * c.q_len * s.out_stride);
    dq0 = random_values(seed + 3, q.size(), 0.5f);
    dkv0 = random_values(seed + 4, kv.size(), 0.5f);
    const int64_t total = c.key_block ? c.k_len + c.q_len : c.k_len;
    metadata(c, c.q_len, c.key_block ? c.k_len : 0, total, seed + 5, qpos, qdoc);
    metadata(c, c.k_len, 0, total, seed + 5, kpos, kdoc);
  }
  AttentionVisibility cpu_visibility() const {
    return explicit_meta ? AttentionVisibility{qpos.data(), kpos.data(), qdoc.data(), kdoc.data()} : AttentionVisibility{};
  }
  int64_t width;
  FlashAttentionShape s;
  int64_t k_at, v_at;
  bool explicit_meta;
  std::vector<float> q, kv, dout, dq0, dkv0;
  std::vector<int32_t> qpos, qdoc, kpos, kdoc;
};

// The positions and documents on the device.
struct DeviceMetadata {
  DeviceMetadata(CachingAllocator& allocator, const Inputs& in)
      : qpos(allocator, in.qpos), qdoc(allocator, in.qdoc), kpos(allocator, in.kpos), kdoc(allocator, in.kdoc),
        explicit_meta(in.explicit_meta) {}
  AttentionVisibility visibility() const {
    return explicit_meta ? AttentionVisibility{qpos.ptr, kpos.ptr, qdoc.ptr, kdoc.ptr} : AttentionVisibility{};
  }
  DeviceArray<int32_t> qpos, qdoc, kpos, kdoc;
  bool explicit_meta;
};

// A -inf lse (a query that sees no key) must stay -inf.
void expect_same_empty_rows(const std::vector<float>& got_lse, const std::vector<float>& lse) {
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse[i])) {
      EXPECT_TRUE(std::isinf(got_lse[i]) && got_lse[i] < 0) << "lse " << i;
    }
  }
}

TEST_P(CudaFlashAttention, Fp32ForwardBackwardAndMergeMatchTheCpu) {
  const Inputs in(GetParam(), seed_, false);
  const FlashAttentionShape& s = in.s;
  std::vector<float> out(in.dout.size()), lse(s.batch * s.heads * s.q_len), dq = in.dq0, dkv = in.dkv0;
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  const float *k = in.kv.data() + in.k_at, *v = in.kv.data() + in.v_at;
  flash_attention_forward(cpu, out.data(), lse.data(), in.q.data(), k, v, s, in.cpu_visibility());
  flash_attention_backward(cpu, dq.data(), dkv.data() + in.k_at, dkv.data() + in.v_at, in.dout.data(), out.data(),
                           lse.data(), in.q.data(), k, v, s, in.cpu_visibility());
  DeviceFloats d_q(allocator_, in.q), d_kv(allocator_, in.kv), d_dout(allocator_, in.dout),
      d_out(allocator_, poison(out.size())), d_lse(allocator_, poison(lse.size())), d_dq(allocator_, in.dq0),
      d_dkv(allocator_, in.dkv0);
  const DeviceMetadata meta(allocator_, in);
  const float *d_k = d_kv.ptr + in.k_at, *d_v = d_kv.ptr + in.v_at;
  flash_attention_forward(gpu, d_out.ptr, d_lse.ptr, d_q.ptr, d_k, d_v, s, meta.visibility());
  flash_attention_backward(gpu, d_dq.ptr, d_dkv.ptr + in.k_at, d_dkv.ptr + in.v_at, d_dout.ptr, d_out.ptr, d_lse.ptr,
                           d_q.ptr, d_k, d_v, s, meta.visibility());
  const std::vector<float> got_lse = d_lse.host();
  expect_same_empty_rows(got_lse, lse);
  EXPECT_LE(relative_error(d_out.host(), out), 1e-5);
  EXPECT_LE(relative_error(got_lse, lse), 1e-5);
  EXPECT_LE(relative_error(d_dq.host(), dq), 1e-5);
  EXPECT_LE(relative_error(d_dkv.host(), dkv), 1e-5);
  // Merging a second partial (the same output with shifted LSEs) into the first.
  std::vector<float> part_lse = lse;
  for (float& x : part_lse) x = std::isinf(x) ? x : x - 0.7f;
  const std::vector<float> part_out = random_values(seed_ + 6, out.size(), 1.0f);
  std::vector<float> merged = out, merged_lse = lse;
  merge_attention_partials(cpu, merged.data(), merged_lse.data(), part_out.data(), part_lse.data(), s);
  DeviceFloats d_part(allocator_, part_out), d_part_lse(allocator_, part_lse), d_merged(allocator_, out),
      d_merged_lse(allocator_, lse);
  merge_attention_partials(gpu, d_merged.ptr, d_merged_lse.ptr, d_part.ptr, d_part_lse.ptr, s);
  EXPECT_LE(relative_error(d_merged.host(), merged), 1e-5);
  EXPECT_LE(relative_error(d_merged_lse.host(), merged_lse), 1e-5);
}

// bf16 q/k/v (the tensor-core kernels at head_dim 64 and 128, the CUDA-core one otherwise): out
// within 1e-2 and lse within 1e-4 of the CPU's fp32 kernel on the same bf16-rounded inputs,
// gradients (added into non-zero ones) within 1e-2 of the CPU's from the GPU's out, and a second
// backward bit for bit the first (one writer per gradient element).
TEST_P(CudaFlashAttention, Bf16ForwardAndBackwardMatchTheCpuDeterministically) {
  const Inputs in(GetParam(), seed_, true);
  const FlashAttentionShape& s = in.s;
  const float *k = in.kv.data() + in.k_at, *v = in.kv.data() + in.v_at;
  std::vector<float> out(in.dout.size()), lse(s.batch * s.heads * s.q_len);
  flash_attention_forward(Device::cpu(), out.data(), lse.data(), in.q.data(), k, v, s, in.cpu_visibility());
  DeviceArray<__nv_bfloat16> d_q(allocator_, to_bf16(in.q)), d_kv(allocator_, to_bf16(in.kv)),
      d_dout(allocator_, to_bf16(in.dout)), d_out(allocator_, std::vector<__nv_bfloat16>(out.size(), __float2bfloat16(NAN)));
  DeviceFloats d_lse(allocator_, poison(lse.size())), d_dq(allocator_, in.dq0), d_dkv(allocator_, in.dkv0),
      d_dq2(allocator_, in.dq0), d_dkv2(allocator_, in.dkv0);
  const DeviceMetadata meta(allocator_, in);
  const __nv_bfloat16 *d_k = d_kv.ptr + in.k_at, *d_v = d_kv.ptr + in.v_at;
  flash_attention_forward(d_out.ptr, d_lse.ptr, d_q.ptr, d_k, d_v, s, meta.visibility());
  const std::vector<float> got_out = to_float(d_out.host()), got_lse = d_lse.host();
  expect_same_empty_rows(got_lse, lse);
  EXPECT_LE(relative_error(got_out, out), 1e-2);
  EXPECT_LE(relative_error(got_lse, lse), 1e-4);
  std::vector<float> dq = in.dq0, dkv = in.dkv0;
  flash_attention_backward(Device::cpu(), dq.data(), dkv.data() + in.k_at, dkv.data() + in.v_at, in.dout.data(),
                           got_out.data(), lse.data(), in.q.data(), k, v, s, in.cpu_visibility());
  for (auto [gq, gkv] : {std::pair{&d_dq, &d_dkv}, std::pair{&d_dq2, &d_dkv2}})
    flash_attention_backward(gq->ptr, gkv->ptr + in.k_at, gkv->ptr + in.v_at, d_dout.ptr, d_out.ptr, d_lse.ptr,
                             d_q.ptr, d_k, d_v, s, meta.visibility());
  const std::vector<float> got_dq = d_dq.host(), got_dkv = d_dkv.host();
  EXPECT_LE(relative_error(got_dq, dq), 1e-2);
  EXPECT_LE(relative_error(got_dkv, dkv), 1e-2);
  EXPECT_EQ(d_dq2.host(), got_dq) << "a second backward differs";
  EXPECT_EQ(d_dkv2.host(), got_dkv) << "a second backward differs";
}

// AttentionOperands::Bf16 through the fp32 entries (what the model calls under the bf16 and FP8
// recipes): the GPU casts fp32 q, k, v (and out, dout) to bf16 copies with their strides and runs
// the bf16 kernels; the CPU emulates it (rounded copies, the fp32 kernel, out rounded). out within
// 1e-2 and lse within 1e-4 of the CPU's, out exactly bf16 values; gradients (added into non-zero
// ones) within 1e-2 of the CPU's from the GPU's out; the inputs unchanged.
TEST_P(CudaFlashAttention, Bf16OperandsBehindTheFp32EntriesMatchTheCpuEmulation) {
  Inputs in(GetParam(), seed_, false);
  in.s.operands = AttentionOperands::Bf16;
  const FlashAttentionShape& s = in.s;
  const float *k = in.kv.data() + in.k_at, *v = in.kv.data() + in.v_at;
  std::vector<float> out(in.dout.size()), lse(s.batch * s.heads * s.q_len);
  flash_attention_forward(Device::cpu(), out.data(), lse.data(), in.q.data(), k, v, s, in.cpu_visibility());
  DeviceFloats d_q(allocator_, in.q), d_kv(allocator_, in.kv), d_dout(allocator_, in.dout),
      d_out(allocator_, poison(out.size())), d_lse(allocator_, poison(lse.size())), d_dq(allocator_, in.dq0),
      d_dkv(allocator_, in.dkv0);
  const DeviceMetadata meta(allocator_, in);
  const Device gpu = Device::cuda(0);
  const float *d_k = d_kv.ptr + in.k_at, *d_v = d_kv.ptr + in.v_at;
  flash_attention_forward(gpu, d_out.ptr, d_lse.ptr, d_q.ptr, d_k, d_v, s, meta.visibility());
  const std::vector<float> got_out = d_out.host(), got_lse = d_lse.host();
  expect_same_empty_rows(got_lse, lse);
  EXPECT_LE(relative_error(got_out, out), 1e-2);
  EXPECT_LE(relative_error(got_lse, lse), 1e-4);
  EXPECT_EQ(bf16_rounded(got_out), got_out) << "the output is not rounded to bf16";
  std::vector<float> dq = in.dq0, dkv = in.dkv0;
  flash_attention_backward(Device::cpu(), dq.data(), dkv.data() + in.k_at, dkv.data() + in.v_at, in.dout.data(),
                           got_out.data(), lse.data(), in.q.data(), k, v, s, in.cpu_visibility());
  flash_attention_backward(gpu, d_dq.ptr, d_dkv.ptr + in.k_at, d_dkv.ptr + in.v_at, d_dout.ptr, d_out.ptr, d_lse.ptr,
                           d_q.ptr, d_k, d_v, s, meta.visibility());
  EXPECT_LE(relative_error(d_dq.host(), dq), 1e-2);
  EXPECT_LE(relative_error(d_dkv.host(), dkv), 1e-2);
  EXPECT_EQ(d_q.host(), in.q) << "the entry changed its inputs";
  EXPECT_EQ(d_kv.host(), in.kv) << "the entry changed its inputs";
  EXPECT_EQ(d_dout.host(), in.dout) << "the entry changed its inputs";
}

// LOOM_ATTENTION set to `value` (null: unset) for a scope, restored after.
class AttentionBackendOverride {
 public:
  explicit AttentionBackendOverride(const char* value) {
    const char* before = std::getenv("LOOM_ATTENTION");
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value != nullptr) {
      setenv("LOOM_ATTENTION", value, 1);
    } else {
      unsetenv("LOOM_ATTENTION");
    }
  }
  ~AttentionBackendOverride() {
    if (had_) {
      setenv("LOOM_ATTENTION", before_.c_str(), 1);
    } else {
      unsetenv("LOOM_ATTENTION");
    }
  }
  AttentionBackendOverride(const AttentionBackendOverride&) = delete;
  AttentionBackendOverride& operator=(const AttentionBackendOverride&) = delete;

 private:
  bool had_ = false;
  std::string before_;
};

// The entries on bf16 tensors (Attention::bf16_tensors: q, k, v, out and dout in bf16) compute
// what the fp32 entries with bf16 operands compute, bit for bit, on loom's deterministic kernels:
// the forward's bf16 output is the fp32 entry's widened one, lse the same; the backward adds the
// same dq, dk, dv.
TEST_P(CudaFlashAttention, Bf16TensorEntriesEqualTheFp32EntriesBitForBit) {
  const AttentionBackendOverride loom("loom");
  Inputs in(GetParam(), seed_, false);
  in.s.operands = AttentionOperands::Bf16;
  const FlashAttentionShape& s = in.s;
  const Device gpu = Device::cuda(0);
  const int64_t lse_count = s.batch * s.heads * s.q_len;
  DeviceFloats d_q(allocator_, in.q), d_kv(allocator_, in.kv), d_dout(allocator_, in.dout);
  DeviceFloats d_out(allocator_, poison(in.dout.size())), d_lse(allocator_, poison(lse_count));
  DeviceFloats d_lse16(allocator_, poison(lse_count));
  DeviceArray<__nv_bfloat16> out16(allocator_, to_bf16(poison(in.dout.size())));
  DeviceArray<__nv_bfloat16> q16(allocator_, to_bf16(in.q)), kv16(allocator_, to_bf16(in.kv));
  const DeviceMetadata meta(allocator_, in);
  const float *d_k = d_kv.ptr + in.k_at, *d_v = d_kv.ptr + in.v_at;
  const __nv_bfloat16 *k16 = kv16.ptr + in.k_at, *v16 = kv16.ptr + in.v_at;
  flash_attention_forward(gpu, d_out.ptr, d_lse.ptr, d_q.ptr, d_k, d_v, s, meta.visibility());
  flash_attention_forward_bf16_tensors(gpu, out16.ptr, d_lse16.ptr, q16.ptr, k16, v16, s, meta.visibility());
  const std::vector<float> out = d_out.host();
  EXPECT_EQ(to_float(out16.host()), out) << "forward's bf16 output";
  EXPECT_EQ(d_lse16.host(), d_lse.host()) << "lse";
  DeviceArray<__nv_bfloat16> dout16(allocator_, to_bf16(in.dout));
  DeviceFloats dq(allocator_, in.dq0), dkv(allocator_, in.dkv0), dq16(allocator_, in.dq0), dkv16(allocator_, in.dkv0);
  flash_attention_backward(gpu, dq.ptr, dkv.ptr + in.k_at, dkv.ptr + in.v_at, d_dout.ptr, d_out.ptr, d_lse.ptr,
                           d_q.ptr, d_k, d_v, s, meta.visibility());
  flash_attention_backward_bf16_tensors(gpu, dq16.ptr, dkv16.ptr + in.k_at, dkv16.ptr + in.v_at, dout16.ptr,
                                        out16.ptr, d_lse.ptr, q16.ptr, k16, v16, s, meta.visibility());
  EXPECT_EQ(dq16.host(), dq.host()) << "dq";
  EXPECT_EQ(dkv16.host(), dkv.host()) << "dk, dv";
}

// The [rows, width] view at `at` of x (rows `stride` apart), packed.
std::vector<float> view_of(const std::vector<float>& x, int64_t at, int64_t rows, int64_t width, int64_t stride) {
  std::vector<float> view;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = x.begin() + at + r * stride;
    view.insert(view.end(), row, row + width);
  }
  return view;
}

// Runs check(loom_kernels, rotate) on loom's kernels and where cuDNN serves (LOOM_ATTENTION), each
// with and without a rotation where queries and keys are the same tokens; LOOM_ATTENTION restored.
// LOOM_ATTENTION=loom in the environment keeps to loom's kernels (racecheck, which would report
// cuDNN's wgmma kernels' barriers as races: gpu_test.sh).
template <typename Check>
void for_each_backend_and_rotation(const Case& c, Check check) {
  const char* pinned = std::getenv("LOOM_ATTENTION");
  const bool loom_only = pinned != nullptr && std::string(pinned) == "loom";
  for (const auto& [loom_kernels, rotate] : {std::pair{true, false}, {false, false}, {true, true}, {false, true}}) {
    if ((rotate && c.q_len != c.k_len) || (loom_only && !loom_kernels)) continue;
    const AttentionBackendOverride backend(loom_kernels ? "loom" : nullptr);
    check(loom_kernels, rotate);
  }
}

// A case's bf16 forward on the GPU (bf16 q, k, v, dout) and its bf16-tensor backward added into
// zeroed gradients, rotated back with `rotate` (queries and keys the same tokens): what the
// entries writing their gradients whole are checked against.
struct AddedGradients {
  AddedGradients(CachingAllocator& allocator, const Case& c, uint32_t seed, bool rotate)
      : in(c, seed, false),
        q_rows(c.batch * c.q_len),
        k_rows(c.batch * c.k_len),
        q_width(c.heads * c.head_dim),
        kv_width(c.kv_heads * c.head_dim),
        rope(c.q_len, c.head_dim, 10000.0),
        lse(allocator, poison(c.batch * c.q_len * c.heads)),
        out16(allocator, to_bf16(poison(in.dout.size()))),
        q16(allocator, to_bf16(in.q)),
        kv16(allocator, to_bf16(in.kv)),
        dout16(allocator, to_bf16(in.dout)),
        meta(allocator, in),
        dq(allocator, std::vector<float>(in.q.size(), 0.0f)),
        dkv(allocator, std::vector<float>(in.kv.size(), 0.0f)),
        k16(kv16.ptr + in.k_at),
        v16(kv16.ptr + in.v_at) {
    in.s.operands = AttentionOperands::Bf16;
    const FlashAttentionShape& s = in.s;
    const Device gpu = Device::cuda(0);
    flash_attention_forward_bf16_tensors(gpu, out16.ptr, lse.ptr, q16.ptr, k16, v16, s, meta.visibility());
    flash_attention_backward_bf16_tensors(gpu, dq.ptr, dkv.ptr + in.k_at, dkv.ptr + in.v_at, dout16.ptr, out16.ptr,
                                          lse.ptr, q16.ptr, k16, v16, s, meta.visibility());
    if (rotate) {
      rope_backward(gpu, dq.ptr, s.batch * s.q_len, s.q_stride, 0, s.heads, s.q_len, 0, rope);
      rope_backward(gpu, dkv.ptr + in.k_at, s.batch * s.k_len, s.k_stride, 0, s.kv_heads, s.q_len, 0, rope);
    }
  }
  Inputs in;
  int64_t q_rows, k_rows, q_width, kv_width;  // the gradient views' rows and widths
  RopeTable rope;
  DeviceFloats lse;
  DeviceArray<__nv_bfloat16> out16, q16, kv16, dout16;
  DeviceMetadata meta;
  DeviceFloats dq, dkv;  // the added gradients
  const __nv_bfloat16 *k16, *v16;
};

// The backward writing bf16 gradients (Attention::bf16_gradients), under LOOM_ATTENTION=loom and
// unset (cuDNN where it serves): on loom's kernels the fp32 entry's gradients from zero rounded,
// bit for bit, and the bias sums exactly add_column_sums of those fp32 gradients; on cuDNN (whose
// atomics make two calls differ in the last bits) within bf16's rounding of them, and the bias
// sums exactly the column sums of the bf16 values it wrote. Nothing outside the views is written.
// With a rotation (where queries and keys are the same tokens; no bias sums then) q's and k's
// gradients are rotated back first, as rope_backward rotates the fp32 ones.
TEST_P(CudaFlashAttention, Bf16GradientsAreTheFp32GradientsRounded) {
  for_each_backend_and_rotation(GetParam(), [&](bool loom_kernels, bool rotate) {
    const AddedGradients a(allocator_, GetParam(), seed_, rotate);
    const Inputs& in = a.in;
    const FlashAttentionShape& s = in.s;
    const Device gpu = Device::cuda(0);
    const QkvRotation rotation{rotate ? &a.rope : nullptr, s.q_len, nullptr};
    const __nv_bfloat16 kPoison = __float2bfloat16_rn(-7.0f);
    DeviceArray<__nv_bfloat16> g16(allocator_, std::vector<__nv_bfloat16>(in.q.size(), kPoison)),
        gkv16(allocator_, std::vector<__nv_bfloat16>(in.kv.size(), kPoison));
    const std::vector<float> bias0 = random_values(seed_ + 5, a.q_width + 2 * a.kv_width, 1.0f);
    DeviceFloats bias(allocator_, bias0);
    float* dbias = rotate ? nullptr : bias.ptr;  // no bias sums of rotated gradients
    flash_attention_backward_bf16_gradients(
        gpu, g16.ptr, gkv16.ptr + in.k_at, gkv16.ptr + in.v_at, dbias, rotate ? nullptr : dbias + a.q_width,
        rotate ? nullptr : dbias + a.q_width + a.kv_width, a.dout16.ptr, a.out16.ptr, a.lse.ptr, a.q16.ptr, a.k16,
        a.v16, s, a.meta.visibility(), rotation);
    // Where cuDNN serves this call (its bf16 gradients, not bit for bit) or loom's kernels do.
    const bool on_cudnn =
        !loom_kernels && attention_fallback_reason(s, a.meta.visibility(), true,
                                                   {a.q16.ptr, a.k16, a.v16, a.out16.ptr, a.dout16.ptr, a.lse.ptr})
                             .empty();
    const std::vector<float> want_q = a.dq.host(), want_kv = a.dkv.host();
    const std::vector<float> got_q = to_float(g16.host()), got_kv = to_float(gkv16.host()), got_bias = bias.host();
    const std::string name = std::string(on_cudnn ? "cuDNN" : "loom's kernels") + ", " + std::to_string(s.q_len) +
                             " queries" + (rotate ? ", RoPE undone" : "");
    // Each view against the fp32 gradients, and its column sums over what it wrote (cuDNN) or over
    // the fp32 values (loom's kernels).
    std::vector<float> want_bias = bias0;
    int64_t written = 0;
    auto check_view = [&](const char* view, const std::vector<float>& want, const std::vector<float>& got, int64_t at,
                          int64_t rows, int64_t width, int64_t stride, int64_t bias_at) {
      const std::vector<float> want_view = view_of(want, at, rows, width, stride),
                               got_view = view_of(got, at, rows, width, stride);
      written += rows * width;
      if (on_cudnn) {
        EXPECT_LE(relative_error(got_view, want_view), 1e-2) << name << ": " << view;
      } else {
        EXPECT_EQ(got_view, bf16_rounded(want_view)) << name << ": " << view;
      }
      const std::vector<float>& summed = on_cudnn ? got_view : want_view;
      if (!rotate) ::loom::kernels::cpu::add_column_sums(want_bias.data() + bias_at, summed.data(), rows, width);
    };
    check_view("dq", want_q, got_q, 0, a.q_rows, a.q_width, s.q_stride, 0);
    check_view("dk", want_kv, got_kv, in.k_at, a.k_rows, a.kv_width, s.k_stride, a.q_width);
    check_view("dv", want_kv, got_kv, in.v_at, a.k_rows, a.kv_width, s.v_stride, a.q_width + a.kv_width);
    EXPECT_EQ(got_bias, want_bias) << name << ": bias sums";
    int64_t poisoned = 0;
    for (float v : got_q) poisoned += v == -7.0f;
    for (float v : got_kv) poisoned += v == -7.0f;
    EXPECT_GE(poisoned, static_cast<int64_t>(got_q.size() + got_kv.size()) - written)
        << name << ": wrote outside its views";
  });
}

// The backward writing its gradients whole in fp32 (per-tensor FP8's q/k/v gradient) writes what
// the bf16-tensor backward adds into zeroed views, rotated back where asked: on loom's kernels bit
// for bit; on cuDNN (whose atomics make two calls differ in the last bits) within bf16's precision
// of another call's, and bit for bit rope_backward_widened's rotation (CudaKernels'
// RopeBackwardWidenedIsTheAddIntoZerosRotated). Nothing outside the views is written. The amax
// taken by the same call (fp8_current's, for the projection's cast) is the max |v| of the three
// views as written, bit for bit.
TEST_P(CudaFlashAttention, Fp32GradientsAreTheAddedOnesRotated) {
  for_each_backend_and_rotation(GetParam(), [&](bool loom_kernels, bool rotate) {
    const AddedGradients a(allocator_, GetParam(), seed_, rotate);
    const FlashAttentionShape& s = a.in.s;
    const Device gpu = Device::cuda(0);
    DeviceFloats g(allocator_, std::vector<float>(a.in.q.size(), -7.0f)),
        gkv(allocator_, std::vector<float>(a.in.kv.size(), -7.0f)), amax(allocator_, std::vector<float>{0.0f});
    flash_attention_backward_fp32_gradients(gpu, g.ptr, gkv.ptr + a.in.k_at, gkv.ptr + a.in.v_at, a.dout16.ptr,
                                            a.out16.ptr, a.lse.ptr, a.q16.ptr, a.k16, a.v16, s, a.meta.visibility(),
                                            QkvRotation{rotate ? &a.rope : nullptr, s.q_len, nullptr}, amax.ptr);
    const bool on_cudnn =
        !loom_kernels && attention_fallback_reason(s, a.meta.visibility(), true,
                                                   {a.q16.ptr, a.k16, a.v16, a.out16.ptr, a.dout16.ptr, a.lse.ptr})
                             .empty();
    const std::vector<float> want_q = a.dq.host(), want_kv = a.dkv.host(), got_q = g.host(), got_kv = gkv.host();
    const std::string name = std::string(on_cudnn ? "cuDNN" : "loom's kernels") + ", " + std::to_string(s.q_len) +
                             " queries" + (rotate ? ", RoPE undone" : "");
    // Each view against the added gradients.
    struct View {
      const char* name;
      bool in_kv;
      int64_t at, rows, width, stride;
    };
    int64_t written = 0;
    float largest = 0.0f;
    for (const View& v : {View{"dq", false, 0, a.q_rows, a.q_width, s.q_stride},
                          View{"dk", true, a.in.k_at, a.k_rows, a.kv_width, s.k_stride},
                          View{"dv", true, a.in.v_at, a.k_rows, a.kv_width, s.v_stride}}) {
      const std::vector<float> want = view_of(v.in_kv ? want_kv : want_q, v.at, v.rows, v.width, v.stride),
                               got = view_of(v.in_kv ? got_kv : got_q, v.at, v.rows, v.width, v.stride);
      written += v.rows * v.width;
      for (float x : got) largest = std::max(largest, std::fabs(x));
      if (on_cudnn) {
        EXPECT_LE(relative_error(got, want), 1e-2) << name << ": " << v.name;
      } else {
        EXPECT_EQ(got, want) << name << ": " << v.name;
      }
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(amax.host()[0]), std::bit_cast<uint32_t>(largest)) << name << ": amax";
    EXPECT_GT(largest, 0.0f) << name;
    int64_t poisoned = 0;
    for (float v : got_q) poisoned += v == -7.0f;
    for (float v : got_kv) poisoned += v == -7.0f;
    EXPECT_GE(poisoned, static_cast<int64_t>(got_q.size() + got_kv.size()) - written)
        << name << ": wrote outside its views";
  });
}

// fp64 causal attention of one document per row (q = k tokens, packed [batch, seq, heads, dim]).
std::vector<double> reference_out(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  const FlashAttentionShape& s) {
  std::vector<double> out(s.batch * s.q_len * s.heads * s.head_dim, 0.0);
  const int64_t group = s.heads / s.kv_heads;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        std::vector<double> w(i + 1);
        double hi = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d)
            dot += static_cast<double>(q[(b * s.q_len + i) * s.q_stride + h * s.head_dim + d]) *
                   k[(b * s.k_len + j) * s.k_stride + (h / group) * s.head_dim + d];
          w[j] = dot / std::sqrt(static_cast<double>(s.head_dim));
          hi = std::max(hi, w[j]);
        }
        for (double& x : w) sum += (x = std::exp(x - hi));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < s.head_dim; ++d)
            out[(b * s.q_len + i) * s.out_stride + h * s.head_dim + d] +=
                w[j] / sum * v[(b * s.k_len + j) * s.v_stride + (h / group) * s.head_dim + d];
      }
  return out;
}

TEST(CudaFlashAttentionBf16, ForwardWithin1e2OfFp64AndBackwardOfTheCpu) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = fresh_seed();
  CachingAllocator allocator;
  const int64_t batch = 2, seq = 130, heads = 4, kv_heads = 2, dim = 64;
  const FlashAttentionShape s{batch, seq, seq, heads, kv_heads, dim, heads * dim, kv_heads * dim, kv_heads * dim, heads * dim};
  const auto rounded = bf16_rounded;
  const std::vector<float> q = rounded(random_values(seed, batch * seq * heads * dim, 1.0f)),
                           k = rounded(random_values(seed + 1, batch * seq * kv_heads * dim, 1.0f)),
                           v = rounded(random_values(seed + 2, batch * seq * kv_heads * dim, 1.0f)),
                           dout = rounded(random_values(seed + 3, batch * seq * heads * dim, 1.0f));
  DeviceArray<__nv_bfloat16> d_q(allocator, to_bf16(q)), d_k(allocator, to_bf16(k)), d_v(allocator, to_bf16(v)),
      d_dout(allocator, to_bf16(dout)), d_out(allocator, std::vector<__nv_bfloat16>(q.size(), __float2bfloat16(NAN)));
  DeviceFloats d_lse(allocator, poison(batch * heads * seq)), d_dq(allocator, std::vector<float>(q.size(), 0.0f)),
      d_dk(allocator, std::vector<float>(k.size(), 0.0f)), d_dv(allocator, std::vector<float>(v.size(), 0.0f));
  flash_attention_forward(d_out.ptr, d_lse.ptr, d_q.ptr, d_k.ptr, d_v.ptr, s, AttentionVisibility{});
  const std::vector<__nv_bfloat16> out16 = d_out.host();
  std::vector<float> out(out16.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = __bfloat162float(out16[i]);
  EXPECT_LE(relative_error(out, reference_out(q, k, v, s)), 1e-2);
  // Backward from the bf16 out: the CPU's fp32 gradients on the same inputs.
  std::vector<float> lse(batch * heads * seq), cpu_out(q.size()), dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  flash_attention_forward(Device::cpu(), cpu_out.data(), lse.data(), q.data(), k.data(), v.data(), s, {});
  flash_attention_backward(Device::cpu(), dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                           k.data(), v.data(), s, {});
  flash_attention_backward(d_dq.ptr, d_dk.ptr, d_dv.ptr, d_dout.ptr, d_out.ptr, d_lse.ptr, d_q.ptr, d_k.ptr, d_v.ptr, s,
                           AttentionVisibility{});
  EXPECT_LE(relative_error(d_dq.host(), dq), 1e-2);
  EXPECT_LE(relative_error(d_dk.host(), dk), 1e-2);
  EXPECT_LE(relative_error(d_dv.host(), dv), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaFlashAttention,
    ::testing::Values(Case{"causal_gqa_d64", 2, 100, 100, 4, 2, 64, false, false},
                      // A length cuDNN's backward serves on every release (a multiple of 128).
                      Case{"causal_gqa_d64_256", 2, 256, 256, 4, 2, 64, false, false},
                      Case{"one_token", 1, 1, 1, 1, 1, 8, false, false},
                      Case{"documents_d128", 2, 257, 257, 2, 1, 128, true, false},
                      Case{"key_block_d40", 1, 37, 150, 3, 3, 40, true, true},
                      Case{"long_d64", 1, 1030, 1030, 2, 2, 64, true, false},
                      Case{"key_block_gqa_d128", 2, 70, 200, 4, 2, 128, true, true},
                      Case{"causal_d128", 1, 513, 513, 2, 2, 128, false, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace loom::kernels::cuda
