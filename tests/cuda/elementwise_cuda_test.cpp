// The CUDA kernels behind the device-neutral entries, called through kernels/ops.h on
// Device::cuda(0) (start_backend registers them) and compared with the same entries on the CPU:
// fresh random inputs each run, outputs poisoned, backward adding into non-zero gradients.
// Embedding, LayerNorm, RoPE, fused softmax cross-entropy and its vocabulary-parallel pieces (with
// a per-token objective's gradient), sum of squares, scaling and adding, AdamW over many tensors,
// DiLoCo's outer update, bf16/f16 copies of fp32 arrays.
// fp32 within 1e-5 relative (bit for bit where the kernel rounds as the CPU does: RoPE, AdamW).
// Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceArray;
using testing::DeviceFloats;
using testing::poison;
using testing::random_ids;
using testing::random_values;
using testing::relative_error;

constexpr Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);

// The packed transposed cast's tile rows (cast.h's set_tiled_cast_rows) while in scope, the default
// after.
struct TiledCastRows {
  explicit TiledCastRows(int rows) { set_tiled_cast_rows(rows); }
  ~TiledCastRows() { set_tiled_cast_rows(0); }
  TiledCastRows(const TiledCastRows&) = delete;
  TiledCastRows& operator=(const TiledCastRows&) = delete;
};

class CudaEntries : public testing::GpuTest<> {
 protected:
  // fp8_delayed's pending amax accumulates: a running value below the operand's, then the max with it.
  static constexpr float kRunningAmax = 1e-3f;
  // A producer's per-tensor FP8 cast: fp8_current's scale from `amax` with margin 1, or
  // fp8_delayed's host scale 2.5 with the amax taken into `taken` by the codes' own pass.
  static CastOperand produced_cast(bool current, bool e5m2, float* amax, float* taken) {
    CastOperand cast;
    cast.cast = OperandCast::Fp8Tensor;
    cast.e5m2 = e5m2;
    cast.scale = 2.5f;
    cast.amax = current ? amax : nullptr;
    cast.margin = current ? 1 : 0;
    if (!current) cast.amax_out = taken;
    return cast;
  }
  // Per-tensor FP8 codes a producing kernel writes (`produce(codes, transposed)`, both poisoned
  // first, with packed tiles of `tile_rows` rows) from values whose fp32 form `values` [rows, cols]
  // holds: bit for bit cast_operand_both of those values with 64-row tiles (which
  // TransposedCastsAreThePlainCastTransposed checks against the plain cast), in both orientations,
  // with the scale and its inverse after each (the scale from cast.amax and cast.margin, or
  // cast.scale).
  template <typename Produce>
  void expect_produced_codes(const float* values, int64_t rows, int64_t cols, const CastOperand& cast,
                             const std::string& name, Produce produce, int tile_rows) {
    const int64_t n = rows * cols;
    const int64_t bytes = kept_operand_bytes(OperandCast::Fp8Tensor, rows, cols);
    const int64_t offset = weight_cast_layout(OperandCast::Fp8Tensor, rows, cols).scale_offset;
    DeviceArray<uint8_t> codes(allocator_, std::vector<uint8_t>(bytes, 0xab)),
        transposed(allocator_, std::vector<uint8_t>(bytes, 0xcd)), want(allocator_, std::vector<uint8_t>(bytes, 0)),
        want_t(allocator_, std::vector<uint8_t>(bytes, 0));
    {
      const TiledCastRows tiles(tile_rows);
      produce(codes.ptr, transposed.ptr);
    }
    const TiledCastRows reference_tiles(64);
    auto* scales = reinterpret_cast<float*>(want.ptr + offset);
    fp8_tensor_scale(cast.amax, cast.scale, cast.margin, cast.e5m2 ? Fp8::E5M2 : Fp8::E4M3, scales);
    cast_operand_both(values, want.ptr, want_t.ptr, rows, cols, cast.e5m2 ? CastTo::E5M2 : CastTo::E4M3, scales);
    check_cuda(cudaMemcpy(want_t.ptr + offset, scales, kFp8ScalePairFloats * sizeof(float), cudaMemcpyDeviceToDevice),
               "copy");
    const std::vector<uint8_t> got = codes.host(), got_t = transposed.host(), w = want.host(), w_t = want_t.host();
    auto part = [](const std::vector<uint8_t>& v, int64_t from, int64_t count) {
      return std::vector<uint8_t>(v.begin() + from, v.begin() + from + count);
    };
    EXPECT_EQ(part(got, 0, n), part(w, 0, n)) << name << ": codes";
    EXPECT_EQ(part(got_t, 0, n), part(w_t, 0, n)) << name << ": transposed codes";
    const int64_t inverse = offset + kFp8InverseOffset * 4;
    EXPECT_EQ(part(got, offset, 4), part(w, offset, 4)) << name << ": scale";
    EXPECT_EQ(part(got, inverse, 4), part(w, inverse, 4)) << name << ": inverse";
    EXPECT_EQ(part(got_t, offset, 4), part(w, offset, 4)) << name << ": scale beside the transposed codes";
    EXPECT_EQ(part(got_t, inverse, 4), part(w, inverse, 4)) << name << ": inverse beside the transposed codes";
  }
};

TEST_F(CudaEntries, EmbeddingForwardBackwardAndShardsMatchTheCpu) {
  for (auto [rows, dim, vocab] : {std::tuple<int64_t, int64_t, int32_t>{1, 1, 3}, {37, 129, 50}, {4096, 768, 1000}}) {
    const std::vector<float> table = random_values(seed_, vocab * dim, 1.0f), dout = random_values(seed_ + 1, rows * dim, 1.0f),
                             base = random_values(seed_ + 2, rows * dim, 1.0f), dtable0 = random_values(seed_ + 3, vocab * dim, 0.5f);
    const std::vector<int32_t> ids = random_ids(seed_ + 4, rows, 0, vocab - 1);
    const int64_t first = vocab / 3, count = vocab / 2 + 1;
    std::vector<float> out = base, shard_out(rows * dim), dtable = dtable0, dshard(dtable0.begin(), dtable0.begin() + count * dim);
    embedding_forward(kCpu, out.data(), ids.data(), table.data(), rows, dim, true);
    embedding_backward(kCpu, dtable.data(), dout.data(), ids.data(), rows, dim);
    embedding_forward_shard(kCpu, shard_out.data(), ids.data(), table.data() + first * dim, rows, dim, first, count);
    embedding_backward_shard(kCpu, dshard.data(), dout.data(), ids.data(), rows, dim, first, count);
    DeviceArray<int32_t> d_ids(allocator_, ids);
    DeviceFloats d_table(allocator_, table), d_dout(allocator_, dout), d_out(allocator_, base),
        d_shard_out(allocator_, poison(rows * dim)), d_dtable(allocator_, dtable0),
        d_dshard(allocator_, std::vector<float>(dtable0.begin(), dtable0.begin() + count * dim));
    embedding_forward(kGpu, d_out.ptr, d_ids.ptr, d_table.ptr, rows, dim, true);
    embedding_backward(kGpu, d_dtable.ptr, d_dout.ptr, d_ids.ptr, rows, dim);
    embedding_forward_shard(kGpu, d_shard_out.ptr, d_ids.ptr, d_table.ptr + first * dim, rows, dim, first, count);
    embedding_backward_shard(kGpu, d_dshard.ptr, d_dout.ptr, d_ids.ptr, rows, dim, first, count);
    EXPECT_EQ(d_out.host(), out) << rows << " x " << dim;
    EXPECT_EQ(d_shard_out.host(), shard_out) << rows << " x " << dim;
    // Each id's rows added in row order, as the CPU adds them: the same bits.
    EXPECT_EQ(d_dtable.host(), dtable) << rows << " x " << dim;
    EXPECT_EQ(d_dshard.host(), dshard) << rows << " x " << dim;
  }
}

// The embedding's gradient where ids repeat a great deal (one id in most rows, as padding or a
// frequent token), past 65535 rows (the launch's row stride), with ids below and above a shard:
// the CPU's bits, and the same bits on a second run (no atomics).
TEST_F(CudaEntries, EmbeddingBackwardIsTheCpusBitsAndRepeatsWithManyRepeatedIds) {
  const int64_t rows = 70001, dim = 33;
  const int32_t vocab = 97;
  std::vector<int32_t> ids = random_ids(seed_, rows, 0, vocab - 1);
  for (int64_t r = 0; r < rows; r += 3) ids[static_cast<size_t>(r)] = 5;
  const std::vector<float> dout = random_values(seed_ + 1, rows * dim, 1.0f),
                           dtable0 = random_values(seed_ + 2, vocab * dim, 0.5f);
  const int64_t first = 3, count = 40;
  std::vector<float> dtable = dtable0, dshard(dtable0.begin(), dtable0.begin() + count * dim);
  embedding_backward(kCpu, dtable.data(), dout.data(), ids.data(), rows, dim);
  embedding_backward_shard(kCpu, dshard.data(), dout.data(), ids.data(), rows, dim, first, count);
  DeviceArray<int32_t> d_ids(allocator_, ids);
  DeviceFloats d_dout(allocator_, dout);
  for (int run = 0; run < 2; ++run) {
    DeviceFloats d_dtable(allocator_, dtable0), d_dshard(allocator_, std::vector<float>(dtable0.begin(), dtable0.begin() + count * dim));
    embedding_backward(kGpu, d_dtable.ptr, d_dout.ptr, d_ids.ptr, rows, dim);
    embedding_backward_shard(kGpu, d_dshard.ptr, d_dout.ptr, d_ids.ptr, rows, dim, first, count);
    EXPECT_EQ(d_dtable.host(), dtable) << "run " << run;
    EXPECT_EQ(d_dshard.host(), dshard) << "run " << run;
  }
}

TEST_F(CudaEntries, LayerNormForwardAndBackwardMatchTheCpu) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 7}, {37, 256}, {300, 2049}}) {
    const std::vector<float> x = random_values(seed_, rows * dim, 2.0f), w = random_values(seed_ + 1, dim, 1.0f),
                             b = random_values(seed_ + 2, dim, 1.0f), dy = random_values(seed_ + 3, rows * dim, 1.0f),
                             dx0 = random_values(seed_ + 4, rows * dim, 0.5f), dw0 = random_values(seed_ + 5, dim, 0.5f),
                             db0 = random_values(seed_ + 6, dim, 0.5f);
    std::vector<float> out(x.size()), mean(rows), rstd(rows), dx = dx0, dw = dw0, db = db0;
    layernorm_forward(kCpu, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
    layernorm_backward(kCpu, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                       rows, dim);
    DeviceFloats d_x(allocator_, x), d_w(allocator_, w), d_b(allocator_, b), d_dy(allocator_, dy),
        d_out(allocator_, poison(rows * dim)), d_mean(allocator_, poison(rows)), d_rstd(allocator_, poison(rows)),
        d_dx(allocator_, dx0), d_dw(allocator_, dw0), d_db(allocator_, db0);
    layernorm_forward(kGpu, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, d_b.ptr, rows, dim, 1e-5f);
    layernorm_backward(kGpu, d_dx.ptr, d_dw.ptr, d_db.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr, rows,
                       dim);
    EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_mean.host(), mean), 1e-5) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_rstd.host(), rstd), 1e-5) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_dx.host(), dx), 1e-5) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_dw.host(), dw), 1e-5) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_db.host(), db), 1e-5) << rows << " x " << dim;
  }
}

// Two layouts: rows of odd stride and offset (the one-pair-per-thread kernel), and aligned rows
// of 5 heads (the kernel taking four pairs of four heads at a time, with a group of one head left).
struct RopeLayout {
  int64_t heads, stride, first_col;
};
constexpr RopeLayout kRopeLayouts[] = {{3, 5 * 64 + 3, 64 + 3}, {5, 7 * 64, 64}};

// RoPE and AdamW round every GPU operation explicitly, but the CPU build (x86-64-v3) lets the
// compiler contract a * b + c into one FMA where it likes, so the two agree to an ulp or so, not
// bit for bit: 1e-6 relative.
TEST_F(CudaEntries, RopeForwardAndBackwardMatchTheCpu) {
  const RopeTable table(512, 64, 10000.0);
  const int64_t rows = 300, seq = 100;
  const std::vector<int32_t> positions = random_ids(seed_, rows, 0, 511);
  for (const auto [heads, stride, first_col] : kRopeLayouts) {
    for (bool packed : {false, true}) {
      const int32_t* host_positions = packed ? positions.data() : nullptr;
      const std::vector<float> x0 = random_values(seed_ + packed, rows * stride, 1.0f);
      std::vector<float> x = x0;
      rope_forward(kCpu, x.data(), rows, stride, first_col, heads, seq, 7, table, host_positions);
      DeviceFloats d_x(allocator_, x0);
      DeviceArray<int32_t> d_pos(allocator_, positions);
      rope_forward(kGpu, d_x.ptr, rows, stride, first_col, heads, seq, 7, table, packed ? d_pos.ptr : nullptr);
      EXPECT_LE(relative_error(d_x.host(), x), 1e-6) << "forward, packed " << packed << ", stride " << stride;
      rope_backward(kCpu, x.data(), rows, stride, first_col, heads, seq, 7, table, host_positions);
      rope_backward(kGpu, d_x.ptr, rows, stride, first_col, heads, seq, 7, table, packed ? d_pos.ptr : nullptr);
      EXPECT_LE(relative_error(d_x.host(), x), 1e-6) << "backward, packed " << packed << ", stride " << stride;
    }
  }
}

// RoPE on a bf16 tensor stores the fp32 kernel's results rounded, bit for bit on the GPU (the
// same kernel arithmetic on the widened values).
TEST_F(CudaEntries, RopeOnBf16IsTheFp32KernelRounded) {
  const RopeTable table(512, 64, 10000.0);
  const int64_t rows = 300, seq = 100;
  for (const auto [heads, stride, first_col] : kRopeLayouts) {
    const std::vector<float> x = testing::bf16_rounded(random_values(seed_, rows * stride, 1.0f));
    DeviceFloats d_x(allocator_, x);
    DeviceArray<__nv_bfloat16> d_x16(allocator_, testing::to_bf16(x));
    rope_forward(kGpu, d_x.ptr, rows, stride, first_col, heads, seq, 7, table);
    rope_forward_bf16(kGpu, d_x16.ptr, rows, stride, first_col, heads, seq, 7, table);
    EXPECT_EQ(testing::to_float(d_x16.host()), testing::bf16_rounded(d_x.host())) << "stride " << stride;
  }
}

// The norms' bf16 forms store the fp32 kernels' outputs rounded and the same statistics, bit for
// bit on the GPU (the same kernel arithmetic); poisoned outputs, GPT-2's and the ~1B model's widths.
TEST_F(CudaEntries, NormsOnBf16AreTheFp32KernelsRounded) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 37}, {257, 768}, {64, 2048}}) {
    const std::vector<float> x = random_values(seed_, rows * dim, 2.0f), w = random_values(seed_ + 1, dim, 1.0f),
                             b = random_values(seed_ + 2, dim, 0.5f);
    DeviceFloats d_x(allocator_, x), d_w(allocator_, w), d_b(allocator_, b), d_out(allocator_, poison(rows * dim));
    DeviceFloats d_mean(allocator_, poison(rows)), d_rstd(allocator_, poison(rows));
    DeviceFloats d_mean16(allocator_, poison(rows)), d_rstd16(allocator_, poison(rows));
    DeviceArray<__nv_bfloat16> d_out16(allocator_, testing::to_bf16(poison(rows * dim)));
    rmsnorm_forward(kGpu, d_out.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, rows, dim, 1e-5f);
    rmsnorm_forward_bf16(kGpu, d_out16.ptr, d_rstd16.ptr, d_x.ptr, d_w.ptr, rows, dim, 1e-5f);
    EXPECT_EQ(testing::to_float(d_out16.host()), testing::bf16_rounded(d_out.host())) << rows << " x " << dim;
    EXPECT_EQ(d_rstd16.host(), d_rstd.host()) << rows << " x " << dim;
    layernorm_forward(kGpu, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, d_b.ptr, rows, dim, 1e-5f);
    layernorm_forward_bf16(kGpu, d_out16.ptr, d_mean16.ptr, d_rstd16.ptr, d_x.ptr, d_w.ptr, d_b.ptr, rows, dim,
                           1e-5f);
    EXPECT_EQ(testing::to_float(d_out16.host()), testing::bf16_rounded(d_out.host())) << rows << " x " << dim;
    EXPECT_EQ(d_mean16.host(), d_mean.host()) << rows << " x " << dim;
    EXPECT_EQ(d_rstd16.host(), d_rstd.host()) << rows << " x " << dim;
  }
}

// A norm backward's inputs at rows x dim on the device: the input, weight and bias, an output
// gradient of bf16 values (also as bf16), starting values of din and the parameter gradients
// (non-zero: the backwards add into them), and poisoned room for the forward's outputs.
struct NormBackwardInputs {
  NormBackwardInputs(CachingAllocator& a, uint32_t seed, int64_t rows, int64_t dim)
      : dy_values(testing::bf16_rounded(random_values(seed + 3, rows * dim, 0.1f))),
        dx0(random_values(seed + 4, rows * dim, 0.01f)),
        dw0(random_values(seed + 5, dim, 0.1f)),
        x(a, random_values(seed, rows * dim, 2.0f)),
        w(a, random_values(seed + 1, dim, 1.0f)),
        b(a, random_values(seed + 2, dim, 0.5f)),
        dy(a, dy_values),
        dy16(a, testing::to_bf16(dy_values)),
        out(a, poison(rows * dim)),
        mean(a, poison(rows)),
        rstd(a, poison(rows)) {}
  std::vector<float> dy_values, dx0, dw0;
  DeviceFloats x, w, b, dy;
  DeviceArray<__nv_bfloat16> dy16;
  DeviceFloats out, mean, rstd;
};

// The norms' backwards over a bf16 output gradient (a bf16 projection's input gradient) equal the
// fp32 kernels on its values widened, bit for bit: din added into non-zero values, the weight and
// bias gradients added in; held and unheld layouts (dim 37 rows are not in packs; 8192 is wider
// than a held row), GPT-2's and the ~1B model's widths.
TEST_F(CudaEntries, NormBackwardsOverABf16GradientAreTheFp32KernelsOnItsValues) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 37}, {257, 768}, {64, 2048}, {5, 8192}}) {
    NormBackwardInputs in(allocator_, seed_, rows, dim);
    const std::string where = std::to_string(rows) + " x " + std::to_string(dim);
    for (const bool layer : {false, true}) {
      DeviceFloats dx32(allocator_, in.dx0), dx16(allocator_, in.dx0), dw32(allocator_, in.dw0),
          dw16(allocator_, in.dw0), db32(allocator_, in.dw0), db16(allocator_, in.dw0);
      if (layer) {
        layernorm_forward(kGpu, in.out.ptr, in.mean.ptr, in.rstd.ptr, in.x.ptr, in.w.ptr, in.b.ptr, rows, dim, 1e-5f);
        layernorm_backward(kGpu, dx32.ptr, dw32.ptr, db32.ptr, in.dy.ptr, in.x.ptr, in.w.ptr, in.mean.ptr,
                           in.rstd.ptr, rows, dim);
        layernorm_backward_bf16(kGpu, dx16.ptr, dw16.ptr, db16.ptr, in.dy16.ptr, in.x.ptr, in.w.ptr, in.mean.ptr,
                                in.rstd.ptr, rows, dim);
      } else {
        rmsnorm_forward(kGpu, in.out.ptr, in.rstd.ptr, in.x.ptr, in.w.ptr, rows, dim, 1e-5f);
        rmsnorm_backward(kGpu, dx32.ptr, dw32.ptr, in.dy.ptr, in.x.ptr, in.w.ptr, in.rstd.ptr, rows, dim);
        rmsnorm_backward_bf16(kGpu, dx16.ptr, dw16.ptr, in.dy16.ptr, in.x.ptr, in.w.ptr, in.rstd.ptr, rows, dim);
      }
      const std::string name = (layer ? "LayerNorm " : "RMSNorm ") + where;
      EXPECT_EQ(dx16.host(), dx32.host()) << name << ": din";
      EXPECT_EQ(dw16.host(), dw32.host()) << name << ": dweight";
      EXPECT_EQ(db16.host(), db32.host()) << name << ": dbias";
    }
  }
}

// The add-and-norm forwards: sum is residual + the bf16 product widened, one fp32 rounding (the
// bits of the host's float add), and the outputs and statistics are the bf16 forward's on that sum,
// bit for bit: held and unheld layouts (dim 37 not in packs, 16384 wider than a held row), GPT-2's
// and the ~1B model's widths, a misaligned residual (element by element then, as the forward on
// a sum as misaligned).
TEST_F(CudaEntries, NormsAddingAResidualAreTheAddThenTheNorm) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 37}, {257, 768}, {64, 2048}, {5, 8192}, {2, 16384}}) {
    for (const int64_t offset : {0, 1}) {
      const int64_t n = rows * dim;
      const std::vector<float> residual = random_values(seed_, n + offset, 2.0f);
      const std::vector<float> add = testing::bf16_rounded(random_values(seed_ + 1, n, 1.0f));
      const std::vector<float> w = random_values(seed_ + 2, dim, 1.0f), b = random_values(seed_ + 3, dim, 0.5f);
      std::vector<float> want_sum(n);
      for (int64_t i = 0; i < n; ++i) want_sum[i] = residual[offset + i] + add[i];
      DeviceFloats d_residual(allocator_, residual), d_w(allocator_, w), d_b(allocator_, b);
      DeviceArray<__nv_bfloat16> d_add16(allocator_, testing::to_bf16(add));
      const std::string where =
          std::to_string(rows) + " x " + std::to_string(dim) + " offset " + std::to_string(offset);
      for (const bool layer : {false, true}) {
        DeviceFloats sum(allocator_, poison(n + offset)), mean(allocator_, poison(rows));
        DeviceFloats rstd(allocator_, poison(rows)), plain_mean(allocator_, poison(rows)),
            plain_rstd(allocator_, poison(rows));
        DeviceArray<__nv_bfloat16> out16(allocator_, testing::to_bf16(poison(n))),
            plain16(allocator_, testing::to_bf16(poison(n)));
        float* sum_rows = sum.ptr + offset;
        const float* residual_rows = d_residual.ptr + offset;
        if (layer) {
          layernorm_add_forward_bf16(kGpu, out16.ptr, mean.ptr, rstd.ptr, sum_rows, residual_rows, d_add16.ptr, d_w.ptr,
                                     d_b.ptr, rows, dim, 1e-5f);
          layernorm_forward_bf16(kGpu, plain16.ptr, plain_mean.ptr, plain_rstd.ptr, sum_rows, d_w.ptr, d_b.ptr, rows,
                                 dim, 1e-5f);
        } else {
          rmsnorm_add_forward_bf16(kGpu, out16.ptr, rstd.ptr, sum_rows, residual_rows, d_add16.ptr, d_w.ptr, rows, dim,
                                   1e-5f);
          rmsnorm_forward_bf16(kGpu, plain16.ptr, plain_rstd.ptr, sum_rows, d_w.ptr, rows, dim, 1e-5f);
        }
        const std::string name = (layer ? "LayerNorm " : "RMSNorm ") + where;
        const std::vector<float> got_sum = sum.host();
        EXPECT_EQ(std::vector<float>(got_sum.begin() + offset, got_sum.end()), want_sum) << name << ": sum";
        EXPECT_EQ(testing::to_float(out16.host()), testing::to_float(plain16.host())) << name << ": out";
        EXPECT_EQ(rstd.host(), plain_rstd.host()) << name << ": rstd";
        if (layer) {
          EXPECT_EQ(mean.host(), plain_mean.host()) << name << ": mean";
        }
      }
    }
  }
}

// With din16 the norms' backwards also leave din's new values in bf16 (the residual gradient a bf16
// projection multiplies next): din and the parameter gradients bit for bit those of the run
// without it, din16 exactly din rounded to bf16, over fp32 and bf16 output gradients, held and
// unheld layouts, and a din16 that is not 8-byte aligned (stored element by element).
TEST_F(CudaEntries, NormBackwardsLeaveTheirInputGradientInBf16Too) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 37}, {257, 768}, {64, 2048}, {5, 8192}}) {
    NormBackwardInputs in(allocator_, seed_, rows, dim);
    layernorm_forward(kGpu, in.out.ptr, in.mean.ptr, in.rstd.ptr, in.x.ptr, in.w.ptr, in.b.ptr, rows, dim, 1e-5f);
    for (const bool layer : {false, true}) {
      for (const bool bf16_dout : {false, true}) {
        for (const int64_t offset : {0, 1}) {
          DeviceFloats dx(allocator_, in.dx0), dx_with(allocator_, in.dx0), dw(allocator_, in.dw0),
              dw_with(allocator_, in.dw0), db(allocator_, in.dw0), db_with(allocator_, in.dw0);
          DeviceArray<__nv_bfloat16> din16(allocator_, testing::to_bf16(poison(rows * dim + offset)));
          auto run = [&](float* din, float* dweight, float* dbias, void* out16) {
            if (layer && bf16_dout) {
              layernorm_backward_bf16(kGpu, din, dweight, dbias, in.dy16.ptr, in.x.ptr, in.w.ptr, in.mean.ptr,
                                      in.rstd.ptr, rows, dim, out16);
            } else if (layer) {
              layernorm_backward(kGpu, din, dweight, dbias, in.dy.ptr, in.x.ptr, in.w.ptr, in.mean.ptr, in.rstd.ptr,
                                 rows, dim, out16);
            } else if (bf16_dout) {
              rmsnorm_backward_bf16(kGpu, din, dweight, in.dy16.ptr, in.x.ptr, in.w.ptr, in.rstd.ptr, rows, dim,
                                    out16);
            } else {
              rmsnorm_backward(kGpu, din, dweight, in.dy.ptr, in.x.ptr, in.w.ptr, in.rstd.ptr, rows, dim, out16);
            }
          };
          run(dx.ptr, dw.ptr, db.ptr, nullptr);
          run(dx_with.ptr, dw_with.ptr, db_with.ptr, din16.ptr + offset);
          const std::string name = std::string(layer ? "LayerNorm " : "RMSNorm ") + (bf16_dout ? "bf16 dout " : "") +
                                   std::to_string(rows) + " x " + std::to_string(dim) + " offset " +
                                   std::to_string(offset);
          const std::vector<float> din = dx.host();
          EXPECT_EQ(dx_with.host(), din) << name << ": din";
          EXPECT_EQ(dw_with.host(), dw.host()) << name << ": dweight";
          if (layer) {
            EXPECT_EQ(db_with.host(), db.host()) << name << ": dbias";
          }
          const std::vector<__nv_bfloat16> all16 = din16.host();
          const std::vector<__nv_bfloat16> written(all16.begin() + offset, all16.end());
          EXPECT_EQ(testing::to_float(written), testing::bf16_rounded(din)) << name << ": din16";
        }
      }
    }
  }
}

// With din_amax the norms' backwards also take the max |v| of din's new values (fp8_current's
// scale for the output projection that casts din next): the same float as amax_into over din
// after the call, bit for bit, from 0 and with a larger value already there (which stays); din
// and the parameter gradients those of the run without it; held and unheld layouts, fp32 and
// bf16 output gradients, with din16 beside; a NaN in the output gradient gives NaN.
TEST_F(CudaEntries, NormBackwardsTakeTheAmaxOfTheirInputGradient) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 37}, {4099, 768}, {64, 2048}, {5, 8192}}) {
    NormBackwardInputs in(allocator_, seed_, rows, dim);
    layernorm_forward(kGpu, in.out.ptr, in.mean.ptr, in.rstd.ptr, in.x.ptr, in.w.ptr, in.b.ptr, rows, dim, 1e-5f);
    for (const bool layer : {false, true}) {
      for (const bool bf16_dout : {false, true}) {
        const std::string name = std::string(layer ? "LayerNorm " : "RMSNorm ") + (bf16_dout ? "bf16 dout " : "") +
                                 std::to_string(rows) + " x " + std::to_string(dim);
        auto run = [&](float* din, float* dweight, float* dbias, void* din16, float* amax, const float* dy) {
          if (layer && bf16_dout) {
            layernorm_backward_bf16(kGpu, din, dweight, dbias, in.dy16.ptr, in.x.ptr, in.w.ptr, in.mean.ptr,
                                    in.rstd.ptr, rows, dim, din16, amax);
          } else if (layer) {
            layernorm_backward(kGpu, din, dweight, dbias, dy, in.x.ptr, in.w.ptr, in.mean.ptr, in.rstd.ptr, rows,
                               dim, din16, amax);
          } else if (bf16_dout) {
            rmsnorm_backward_bf16(kGpu, din, dweight, in.dy16.ptr, in.x.ptr, in.w.ptr, in.rstd.ptr, rows, dim,
                                  din16, amax);
          } else {
            rmsnorm_backward(kGpu, din, dweight, dy, in.x.ptr, in.w.ptr, in.rstd.ptr, rows, dim, din16, amax);
          }
        };
        DeviceFloats dx(allocator_, in.dx0), dw(allocator_, in.dw0), db(allocator_, in.dw0);
        run(dx.ptr, dw.ptr, db.ptr, nullptr, nullptr, in.dy.ptr);
        const std::vector<float> din = dx.host();
        float largest = 0.0f;
        for (float v : din) largest = std::max(largest, std::fabs(v));
        for (const float start : {0.0f, 1e30f}) {
          for (const bool with16 : {false, true}) {
            DeviceFloats dx_with(allocator_, in.dx0), dw_with(allocator_, in.dw0), db_with(allocator_, in.dw0),
                amax(allocator_, std::vector<float>{start}), want(allocator_, std::vector<float>{start});
            DeviceArray<__nv_bfloat16> din16(allocator_, testing::to_bf16(poison(rows * dim)));
            run(dx_with.ptr, dw_with.ptr, db_with.ptr, with16 ? din16.ptr : nullptr, amax.ptr, in.dy.ptr);
            kernels::amax_into(kGpu, want.ptr, dx_with.ptr, rows * dim);
            const std::string form = name + (with16 ? " with din16" : "") + " from " + std::to_string(start);
            EXPECT_EQ(dx_with.host(), din) << form << ": din";
            EXPECT_EQ(dw_with.host(), dw.host()) << form << ": dweight";
            if (layer) {
              EXPECT_EQ(db_with.host(), db.host()) << form << ": dbias";
            }
            const float got = amax.host()[0], wanted = want.host()[0];
            EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(wanted)) << form << ": amax";
            EXPECT_EQ(got, start == 0.0f ? largest : start) << form << ": amax";
          }
        }
        if (bf16_dout) continue;
        std::vector<float> dy_nan = in.dy_values;
        dy_nan[static_cast<size_t>(rows * dim / 2)] = std::nanf("");
        DeviceFloats nan_dy(allocator_, dy_nan), dx_nan(allocator_, in.dx0), dw_nan(allocator_, in.dw0),
            db_nan(allocator_, in.dw0), nan_amax(allocator_, std::vector<float>{0.0f});
        run(dx_nan.ptr, dw_nan.ptr, db_nan.ptr, nullptr, nan_amax.ptr, nan_dy.ptr);
        EXPECT_TRUE(std::isnan(nan_amax.host()[0])) << name << ": a NaN in dout";
      }
    }
  }
}

// Columns [first, vocab) of every row of logits [rows, vocab].
std::vector<float> logits_shard(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t first) {
  const int64_t shard = vocab - first;
  std::vector<float> part(rows * shard);
  for (int64_t r = 0; r < rows; ++r)
    std::copy(logits.begin() + r * vocab + first, logits.begin() + (r + 1) * vocab, part.begin() + r * shard);
  return part;
}

TEST_F(CudaEntries, CrossEntropyAndItsVocabParallelPiecesMatchTheCpu) {
  for (auto [rows, vocab] : {std::pair<int64_t, int64_t>{1, 2}, {33, 1000}, {64, 50257}}) {
    const std::vector<float> logits = random_values(seed_, rows * vocab, 3.0f);
    std::vector<int32_t> targets = random_ids(seed_ + 1, rows, 0, static_cast<int32_t>(vocab - 1));
    targets[0] = -1;  // kIgnoreIndex
    std::vector<float> grad = logits, losses(rows);
    const double total = softmax_cross_entropy(kCpu, grad.data(), losses.data(), targets.data(), rows, vocab, 0.25f);
    DeviceFloats d_logits(allocator_, logits), d_losses(allocator_, poison(rows));
    DeviceArray<int32_t> d_targets(allocator_, targets);
    const double gpu_total =
        softmax_cross_entropy(kGpu, d_logits.ptr, d_losses.ptr, d_targets.ptr, rows, vocab, 0.25f);
    EXPECT_NEAR(gpu_total, total, 1e-5 * std::max(1.0, std::fabs(total))) << rows << " x " << vocab;
    EXPECT_LE(relative_error(d_losses.host(), losses), 1e-5) << rows << " x " << vocab;
    EXPECT_LE(relative_error(d_logits.host(), grad), 1e-5) << rows << " x " << vocab;
    // The same through the vocabulary-parallel pieces over one shard [first, first + shard).
    const int64_t first = vocab / 3, shard = vocab - first;
    std::vector<float> part(rows * shard), row_max(rows), stats(2 * rows), part_losses(rows);
    part = logits_shard(logits, rows, vocab, first);
    DeviceFloats d_part(allocator_, part), d_max(allocator_, poison(rows)), d_stats(allocator_, poison(2 * rows)),
        d_part_losses(allocator_, poison(rows));
    vocab_shard_row_max(kCpu, part.data(), rows, shard, row_max.data());
    vocab_shard_exp_sums(kCpu, part.data(), row_max.data(), targets.data(), rows, shard, first, stats.data());
    const double part_total = vocab_shard_finish(kCpu, part.data(), part_losses.data(), row_max.data(), stats.data(),
                                                 targets.data(), rows, shard, first, 0.5f);
    vocab_shard_row_max(kGpu, d_part.ptr, rows, shard, d_max.ptr);
    vocab_shard_exp_sums(kGpu, d_part.ptr, d_max.ptr, d_targets.ptr, rows, shard, first, d_stats.ptr);
    EXPECT_EQ(d_max.host(), row_max);
    EXPECT_LE(relative_error(d_stats.host(), stats), 1e-5);
    const double gpu_part_total = vocab_shard_finish(kGpu, d_part.ptr, d_part_losses.ptr, d_max.ptr, d_stats.ptr,
                                                     d_targets.ptr, rows, shard, first, 0.5f);
    EXPECT_NEAR(gpu_part_total, part_total, 1e-5 * std::max(1.0, std::fabs(part_total)));
    EXPECT_LE(relative_error(d_part_losses.host(), part_losses), 1e-5);
    EXPECT_LE(relative_error(d_part.host(), part), 1e-5);
    // A per-token objective's gradient (GRPO): a scale per row, one of them zero.
    std::vector<float> objective = logits_shard(logits, rows, vocab, first);
    std::vector<float> row_scale = random_values(seed_ + 2, rows, 1.0f);
    row_scale[rows - 1] = 0.0f;
    DeviceFloats d_objective(allocator_, objective), d_scale(allocator_, row_scale);
    vocab_shard_gradient(kCpu, objective.data(), row_max.data(), stats.data(), targets.data(), rows, shard, first,
                         row_scale.data());
    vocab_shard_gradient(kGpu, d_objective.ptr, d_max.ptr, d_stats.ptr, d_targets.ptr, rows, shard, first, d_scale.ptr);
    EXPECT_LE(relative_error(d_objective.host(), objective), 1e-5) << rows << " x " << vocab;
  }
}

// Over bf16 logits (the head's bf16 output on a GPU): the fp32 kernel's arithmetic, so the same
// losses and total bit for bit as softmax_cross_entropy over the same (bf16-valued) logits, and the
// gradient is its gradient rounded to bf16; against the CPU's bf16 form within 1e-5 (and the
// gradient within a bf16 rounding). An ignored row and a gradient scale of 0 too.
TEST_F(CudaEntries, CrossEntropyOverBf16LogitsIsTheFp32KernelRounded) {
  for (auto [rows, vocab] : {std::pair<int64_t, int64_t>{1, 2}, {33, 1000}, {64, 50257}}) {
    const std::vector<float> logits = testing::bf16_rounded(random_values(seed_, rows * vocab, 3.0f));
    std::vector<int32_t> targets = random_ids(seed_ + 1, rows, 0, static_cast<int32_t>(vocab - 1));
    targets[0] = -1;  // kIgnoreIndex
    DeviceArray<int32_t> d_targets(allocator_, targets);
    DeviceFloats d_fp32(allocator_, logits), d_fp32_losses(allocator_, poison(rows)),
        d_losses(allocator_, poison(rows));
    const double fp32_total =
        softmax_cross_entropy(kGpu, d_fp32.ptr, d_fp32_losses.ptr, d_targets.ptr, rows, vocab, 0.25f);
    DeviceArray<__nv_bfloat16> d_bf16(allocator_, testing::to_bf16(logits));
    const double total = softmax_cross_entropy_bf16(kGpu, d_bf16.ptr, d_losses.ptr, d_targets.ptr, rows, vocab, 0.25f);
    EXPECT_EQ(total, fp32_total) << rows << " x " << vocab;
    EXPECT_EQ(d_losses.host(), d_fp32_losses.host()) << rows << " x " << vocab;
    EXPECT_EQ(testing::to_float(d_bf16.host()), testing::bf16_rounded(d_fp32.host())) << rows << " x " << vocab;
    // The CPU's bf16 form.
    std::vector<__nv_bfloat16> cpu_bf16 = testing::to_bf16(logits);
    std::vector<float> cpu_losses(rows);
    const double cpu_total = softmax_cross_entropy_bf16(kCpu, cpu_bf16.data(), cpu_losses.data(), targets.data(), rows,
                                                        vocab, 0.25f);
    EXPECT_NEAR(total, cpu_total, 1e-5 * std::max(1.0, std::fabs(cpu_total)));
    EXPECT_LE(relative_error(d_losses.host(), cpu_losses), 1e-5);
    EXPECT_LE(relative_error(testing::to_float(d_bf16.host()), testing::to_float(cpu_bf16)), 1e-2);
    // grad_scale 0: the losses only, the logits left as they were.
    DeviceArray<__nv_bfloat16> d_kept(allocator_, testing::to_bf16(logits));
    softmax_cross_entropy_bf16(kGpu, d_kept.ptr, d_losses.ptr, d_targets.ptr, rows, vocab, 0.0f);
    EXPECT_EQ(testing::to_float(d_kept.host()), logits);
  }
}

// The MLP's activations over bf16 tensors (the bf16 recipe's MLP interior) against the fp32
// kernels on the same bf16-valued inputs: the fp32 arithmetic rounded once as stored, so within a
// bf16 rounding (relative 4e-3 in the norm); the fp32-output forward and backward within 1e-6 (the same
// kernel up to FMA contraction); and against the CPU's bf16 form.
TEST_F(CudaEntries, ActivationsOverBf16TensorsAreTheFp32KernelsRounded) {
  const int64_t rows = 300, width = 1000;
  for (const MlpActivation a : {MlpActivation::Swiglu, MlpActivation::Gelu, MlpActivation::Relu2}) {
    const int64_t in_width = a == MlpActivation::Swiglu ? 2 * width : width;
    const std::vector<float> in = testing::bf16_rounded(random_values(seed_, rows * in_width, 2.0f)),
                             dout = testing::bf16_rounded(random_values(seed_ + 1, rows * width, 1.0f));
    DeviceFloats d_in(allocator_, in), d_dout(allocator_, dout), d_out(allocator_, poison(rows * width)),
        d_din(allocator_, poison(rows * in_width)), d_din_fp32(allocator_, poison(rows * in_width));
    if (a == MlpActivation::Swiglu) {
      swiglu_forward(kGpu, d_out.ptr, d_in.ptr, rows, width);
      swiglu_backward(kGpu, d_din.ptr, d_dout.ptr, d_in.ptr, rows, width);
    } else if (a == MlpActivation::Gelu) {
      gelu_forward(kGpu, d_out.ptr, d_in.ptr, rows * width);
      gelu_backward(kGpu, d_din.ptr, d_dout.ptr, d_in.ptr, rows * width);
    } else {
      relu2_forward(kGpu, d_out.ptr, d_in.ptr, rows * width);
      relu2_backward(kGpu, d_din.ptr, d_dout.ptr, d_in.ptr, rows * width);
    }
    DeviceArray<__nv_bfloat16> in16(allocator_, testing::to_bf16(in)), dout16(allocator_, testing::to_bf16(dout)),
        out16(allocator_, std::vector<__nv_bfloat16>(rows * width)), din16(allocator_, std::vector<__nv_bfloat16>(rows * in_width));
    activation_forward_bf16(kGpu, a, nullptr, out16.ptr, in16.ptr, rows, width);
    DeviceFloats d_out_fp32(allocator_, poison(rows * width));
    activation_forward_bf16(kGpu, a, d_out_fp32.ptr, nullptr, in16.ptr, rows, width);
    activation_backward_bf16(kGpu, a, nullptr, din16.ptr, nullptr, dout16.ptr, in16.ptr, rows, width);
    activation_backward_bf16(kGpu, a, d_din_fp32.ptr, nullptr, nullptr, dout16.ptr, in16.ptr, rows, width);
    // With a bias's gradient: din in either form as without, and its fp32 values' column sums added
    // in the CPU's order (the same bits as the CPU's sums of that fp32 din).
    const std::vector<float> bias0 = random_values(seed_ + 2, in_width, 1.0f);
    DeviceFloats d_bias16(allocator_, bias0), d_bias32(allocator_, bias0);
    DeviceFloats d_din_summed(allocator_, poison(rows * in_width));
    DeviceArray<__nv_bfloat16> din16_summed(allocator_, std::vector<__nv_bfloat16>(rows * in_width));
    activation_backward_bf16(kGpu, a, nullptr, din16_summed.ptr, d_bias16.ptr, dout16.ptr, in16.ptr, rows, width);
    activation_backward_bf16(kGpu, a, d_din_summed.ptr, nullptr, d_bias32.ptr, dout16.ptr, in16.ptr, rows, width);
    const std::string name = "activation " + std::to_string(static_cast<int>(a));
    EXPECT_LE(relative_error(testing::to_float(out16.host()), d_out.host()), 4e-3) << name;
    EXPECT_LE(relative_error(testing::to_float(din16.host()), d_din.host()), 4e-3) << name;
    EXPECT_LE(relative_error(d_din_fp32.host(), d_din.host()), 1e-6) << name;
    EXPECT_LE(relative_error(d_out_fp32.host(), d_out.host()), 1e-6) << name;
    const std::vector<float> summed = d_din_summed.host();
    EXPECT_LE(relative_error(summed, d_din_fp32.host()), 1e-6) << name;
    EXPECT_EQ(testing::to_float(din16_summed.host()), testing::bf16_rounded(summed)) << name;
    std::vector<float> want_bias = bias0;
    ::loom::kernels::cpu::add_column_sums(want_bias.data(), summed.data(), rows, in_width);
    EXPECT_EQ(d_bias32.host(), want_bias) << name;
    EXPECT_EQ(d_bias16.host(), want_bias) << name;
    std::vector<__nv_bfloat16> cpu_out(rows * width);
    activation_forward_bf16(kCpu, a, nullptr, cpu_out.data(), testing::to_bf16(in).data(), rows, width);
    EXPECT_LE(relative_error(testing::to_float(out16.host()), testing::to_float(cpu_out)), 4e-3) << name;
  }
}

// With an amax, each activation over bf16 tensors takes the max |v| of what it writes into it (a
// per-tensor FP8 cast of its output then needs no amax pass): the same float as amax_into over
// that output, bit for bit, in every output form and with the bias's column sums, at a size whose
// capped grid loops (amax.cuh) and a narrow one; a larger amax stays, a NaN written wins.
TEST_F(CudaEntries, ActivationsTakeTheAmaxOfWhatTheyWrite) {
  for (const auto& [rows, width] : {std::pair<int64_t, int64_t>{3001, 1100}, {7, 45}}) {
    for (const MlpActivation a : {MlpActivation::Swiglu, MlpActivation::Gelu, MlpActivation::Relu2}) {
      const int64_t in_width = a == MlpActivation::Swiglu ? 2 * width : width;
      const std::string name = std::to_string(rows) + " x " + std::to_string(width) + " activation " +
                               std::to_string(static_cast<int>(a));
      std::vector<float> dout = testing::bf16_rounded(random_values(seed_ + 1, rows * width, 1.0f));
      DeviceArray<__nv_bfloat16> in16(allocator_, testing::to_bf16(random_values(seed_, rows * in_width, 3.0f))),
          dout16(allocator_, testing::to_bf16(dout)), out16(allocator_, std::vector<__nv_bfloat16>(rows * width)),
          din16(allocator_, std::vector<__nv_bfloat16>(rows * in_width));
      DeviceFloats out(allocator_, poison(rows * width)), din(allocator_, poison(rows * in_width)),
          bias(allocator_, std::vector<float>(in_width, 0.0f));
      // The amax the kernel took (from `start`) against amax_into over what it wrote.
      auto expect_amax_of = [&](auto run, const float* written, const void* written16, int64_t n, float start,
                                const std::string& form) {
        DeviceFloats got(allocator_, std::vector<float>{start}), want(allocator_, std::vector<float>{start});
        run(got.ptr);
        if (written != nullptr) {
          kernels::amax_into(kGpu, want.ptr, written, n);
        } else {
          kernels::amax_into_bf16(kGpu, want.ptr, written16, n);
        }
        const float g = got.host()[0], w = want.host()[0];
        EXPECT_EQ(std::bit_cast<uint32_t>(g), std::bit_cast<uint32_t>(w))
            << name << " " << form << ": " << g << " vs " << w;
        return g;
      };
      for (float start : {0.0f, 1e30f}) {
        expect_amax_of([&](float* m) { activation_forward_bf16(kGpu, a, out.ptr, nullptr, in16.ptr, rows, width, m); },
                       out.ptr, nullptr, rows * width, start, "forward fp32");
        expect_amax_of(
            [&](float* m) { activation_forward_bf16(kGpu, a, nullptr, out16.ptr, in16.ptr, rows, width, m); },
            nullptr, out16.ptr, rows * width, start, "forward bf16");
        // With no output, the amax alone, of the fp32 values (out holds them from the first form).
        expect_amax_of([&](float* m) { activation_forward_bf16(kGpu, a, nullptr, nullptr, in16.ptr, rows, width, m); },
                       out.ptr, nullptr, rows * width, start, "forward amax alone");
        expect_amax_of([&](float* m) {
          activation_backward_bf16(kGpu, a, din.ptr, nullptr, nullptr, dout16.ptr, in16.ptr, rows, width, m);
        }, din.ptr, nullptr, rows * in_width, start, "backward fp32");
        expect_amax_of([&](float* m) {
          activation_backward_bf16(kGpu, a, nullptr, din16.ptr, nullptr, dout16.ptr, in16.ptr, rows, width, m);
        }, nullptr, din16.ptr, rows * in_width, start, "backward bf16");
        expect_amax_of([&](float* m) {  // din holds the fp32 form's values
          activation_backward_bf16(kGpu, a, nullptr, nullptr, nullptr, dout16.ptr, in16.ptr, rows, width, m);
        }, din.ptr, nullptr, rows * in_width, start, "backward amax alone");
        expect_amax_of([&](float* m) {
          activation_backward_bf16(kGpu, a, din.ptr, nullptr, bias.ptr, dout16.ptr, in16.ptr, rows, width, m);
        }, din.ptr, nullptr, rows * in_width, start, "backward fp32 with bias sums");
        const float last = expect_amax_of([&](float* m) {
          activation_backward_bf16(kGpu, a, nullptr, din16.ptr, bias.ptr, dout16.ptr, in16.ptr, rows, width, m);
        }, nullptr, din16.ptr, rows * in_width, start, "backward bf16 with bias sums");
        if (start == 0.0f) {
          EXPECT_GT(last, 0.0f) << name;
        } else {
          EXPECT_EQ(last, start) << name;
        }
      }
      // NaN in the output gradient where the input is positive (squared ReLU passes no gradient
      // elsewhere; element k of a row is also column k of the input's first half): NaN wins.
      const std::vector<float> in = testing::to_float(in16.host());
      int64_t k = 0;
      while (in[static_cast<size_t>(k)] <= 0.0f) ++k;
      dout[static_cast<size_t>(k)] = std::nanf("");
      DeviceArray<__nv_bfloat16> nan16(allocator_, testing::to_bf16(dout));
      DeviceFloats nan_amax(allocator_, std::vector<float>{0.0f});
      activation_backward_bf16(kGpu, a, din.ptr, nullptr, nullptr, nan16.ptr, in16.ptr, rows, width, nan_amax.ptr);
      EXPECT_TRUE(std::isnan(nan_amax.host()[0])) << name;
    }
  }
}

// Per-tensor FP8 codes cast by the activation's kernels from what they read (Mlp::fp8_codes_from_activation):
// bit for bit cast_operand_both of the fp32 activation (forward, E4M3) or hidden gradient
// (backward, E5M2) the fp32 kernels write, in both orientations, with the scale and its inverse
// after each: fp8_current's from the amax (margin 1), fp8_delayed's host scale with the amax taken
// by the codes' own pass (amax_out: the amax-only pass's value, added into a running one). The
// 32 x 32 tiles one element at a time at 70 rows, a width of 98 (SwiGLU's gradient has 196
// columns: a pack of four would straddle gate and up) and inputs one element off the packs'
// alignment; packed tiles of 64 and of 128 rows four columns at a time for the rest, SwiGLU's
// gradient a gate tile and its up tile per block from the same loads: partial tiles in both parts
// at widths 96 and 2080, 68 and 1100 rows (a partial last row of tiles at either height), and
// 131112 x 12, whose 2049 (1025) tiles outnumber the capped grid (fp8_delayed's amax).
TEST_F(CudaEntries, ActivationCodesAreTheCastOfTheFp32ActivationBitForBit) {
  for (const auto& [rows, width, offset] : {std::tuple<int64_t, int64_t, int64_t>{70, 100, 0}, {68, 98, 0},
                                            {68, 96, 0}, {256, 96, 0}, {256, 96, 1}, {1100, 2080, 0},
                                            {131112, 12, 0}}) {
    for (const MlpActivation a : {MlpActivation::Swiglu, MlpActivation::Gelu, MlpActivation::Relu2}) {
      const int64_t in_width = a == MlpActivation::Swiglu ? 2 * width : width;
      // The inputs after `offset` elements.
      DeviceArray<__nv_bfloat16> in16_data(allocator_,
                                           testing::to_bf16(random_values(seed_, offset + rows * in_width, 3.0f))),
          dout16_data(allocator_, testing::to_bf16(random_values(seed_ + 1, offset + rows * width, 1.0f)));
      const __nv_bfloat16 *in16 = in16_data.ptr + offset, *dout16 = dout16_data.ptr + offset;
      for (const bool backward : {false, true}) {
        const int64_t cols = backward ? in_width : width, n = rows * cols;
        DeviceFloats values(allocator_, poison(n)), amax(allocator_, std::vector<float>{0.0f});
        if (backward) {
          activation_backward_bf16(kGpu, a, values.ptr, nullptr, nullptr, dout16, in16, rows, width, amax.ptr);
        } else {
          activation_forward_bf16(kGpu, a, values.ptr, nullptr, in16, rows, width, amax.ptr);
        }
        for (const auto& [current, tile_rows] : {std::pair<bool, int>{true, 64}, {false, 64}, {true, 128},
                                                 {false, 128}}) {
          const std::string name = std::to_string(rows) + " x " + std::to_string(width) + " offset " +
                                   std::to_string(offset) + " activation " +
                                   std::to_string(static_cast<int>(a)) + (backward ? " backward" : " forward") +
                                   (current ? " fp8_current" : " fp8_delayed") + " tile rows " +
                                   std::to_string(tile_rows);
          DeviceFloats taken(allocator_, std::vector<float>{kRunningAmax});
          const CastOperand cast = produced_cast(current, backward, amax.ptr, taken.ptr);
          expect_produced_codes(
              values.ptr, rows, cols, cast, name,
              [&](void* codes, void* transposed) {
                if (backward) {
                  kernels::activation_backward_codes(kGpu, a, dout16, in16, rows, width, cast, codes, transposed);
                } else {
                  kernels::activation_forward_codes(kGpu, a, in16, rows, width, cast, codes, transposed);
                }
              },
              tile_rows);
          const float want_amax = current ? kRunningAmax : std::max(kRunningAmax, amax.host()[0]);
          EXPECT_EQ(taken.host()[0], want_amax) << name << ": the amax taken by the codes' pass";
        }
      }
    }
  }
}

// Per-tensor FP8 codes of a norm's output cast from its input (Norm::forward_codes): the
// statistics bit for bit those rmsnorm_forward / layernorm_forward save, the amax (fp8_current,
// margin 1) that of their fp32 output, and the codes bit for bit cast_operand_both of that output
// in both orientations; under fp8_delayed (host scale, no amax pass) the codes' pass takes the amax
// into a running value. Sizes not multiples of the tiles (70 rows: 32 x 32 tiles; the others 64 x 64
// or 128 x 64 four columns at a time), more rows than the statistics' capped grid (4096 x 96), and
// the ~1B config's width.
TEST_F(CudaEntries, NormCodesAreTheCastOfTheFp32NormBitForBit) {
  constexpr float kEps = 1e-5f;
  for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{70, 100}, {4096, 96}, {1100, 2048}}) {
    for (const bool layer : {false, true}) {
      const int64_t n = rows * dim;
      DeviceFloats x(allocator_, random_values(seed_, n, 3.0f)), w(allocator_, random_values(seed_ + 1, dim, 1.5f)),
          b(allocator_, random_values(seed_ + 2, dim, 0.5f)), out(allocator_, poison(n)),
          want_mean(allocator_, poison(rows)), want_rstd(allocator_, poison(rows)),
          want_amax(allocator_, std::vector<float>{0.0f});
      if (layer) {
        kernels::layernorm_forward(kGpu, out.ptr, want_mean.ptr, want_rstd.ptr, x.ptr, w.ptr, b.ptr, rows, dim, kEps);
      } else {
        kernels::rmsnorm_forward(kGpu, out.ptr, want_rstd.ptr, x.ptr, w.ptr, rows, dim, kEps);
      }
      kernels::amax_into(kGpu, want_amax.ptr, out.ptr, n);
      for (const auto& [current, tile_rows] : {std::pair<bool, int>{true, 64}, {false, 64}, {true, 128},
                                               {false, 128}}) {
        const std::string name = std::to_string(rows) + " x " + std::to_string(dim) +
                                 (layer ? " layernorm" : " rmsnorm") + (current ? " fp8_current" : " fp8_delayed") +
                                 " tile rows " + std::to_string(tile_rows);
        DeviceFloats mean(allocator_, poison(rows)), rstd(allocator_, poison(rows)),
            amax(allocator_, std::vector<float>{0.0f});
        float* mean_ptr = layer ? mean.ptr : nullptr;
        const float* bias = layer ? b.ptr : nullptr;
        kernels::norm_statistics(kGpu, mean_ptr, rstd.ptr, x.ptr, w.ptr, bias, rows, dim, kEps, current ? amax.ptr : nullptr);
        EXPECT_EQ(rstd.host(), want_rstd.host()) << name << ": rstd";
        if (layer) {
          EXPECT_EQ(mean.host(), want_mean.host()) << name << ": mean";
        }
        EXPECT_EQ(amax.host()[0], current ? want_amax.host()[0] : 0.0f) << name << ": the statistics' amax";
        DeviceFloats taken(allocator_, std::vector<float>{kRunningAmax});
        const CastOperand cast = produced_cast(current, false, amax.ptr, taken.ptr);
        expect_produced_codes(
            out.ptr, rows, dim, cast, name,
            [&](void* codes, void* transposed) {
              kernels::norm_forward_codes(kGpu, x.ptr, w.ptr, bias, mean_ptr, rstd.ptr, rows, dim, cast, codes,
                                          transposed);
            },
            tile_rows);
        EXPECT_EQ(taken.host()[0], current ? kRunningAmax : std::max(kRunningAmax, want_amax.host()[0]))
            << name << ": the amax taken by the codes' pass";
      }
    }
  }
}

// DiLoCo's outer step: the same fused multiply-adds as the CPU, so bit for bit, on sizes around
// the grid's limits; the anchor and momentum poisoned outside [0, n) must stay so.
TEST_F(CudaEntries, NesterovOuterUpdateMatchesTheCpuBitForBit) {
  for (int64_t n : {1, 255, 257, 4097, 3000001}) {
    std::vector<float> anchor = random_values(seed_, n + 1, 1.0f), momentum = random_values(seed_ + 1, n + 1, 0.01f);
    const std::vector<float> delta = random_values(seed_ + 2, n, 1e-3f);
    anchor[static_cast<size_t>(n)] = momentum[static_cast<size_t>(n)] = std::nanf("");
    DeviceFloats d_anchor(allocator_, anchor), d_momentum(allocator_, momentum), d_delta(allocator_, delta);
    nesterov_outer_update(kCpu, anchor.data(), momentum.data(), delta.data(), n, 0.7f, 0.9f);
    nesterov_outer_update(kGpu, d_anchor.ptr, d_momentum.ptr, d_delta.ptr, n, 0.7f, 0.9f);
    const std::vector<float> got_anchor = d_anchor.host(), got_momentum = d_momentum.host();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got_anchor[i]), std::bit_cast<uint32_t>(anchor[i])) << n << " anchor " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(got_momentum[i]), std::bit_cast<uint32_t>(momentum[i])) << n << " momentum " << i;
    }
    EXPECT_TRUE(std::isnan(got_anchor[static_cast<size_t>(n)]) && std::isnan(got_momentum[static_cast<size_t>(n)])) << n;
  }
}

TEST_F(CudaEntries, CrossEntropyNamesABadTargetAndLeavesTheLogits) {
  const std::vector<float> logits = random_values(seed_, 4 * 10, 1.0f);
  DeviceFloats d_logits(allocator_, logits), d_losses(allocator_, poison(4));
  DeviceArray<int32_t> d_targets(allocator_, std::vector<int32_t>{1, 2, 10, 3});
  try {
    softmax_cross_entropy(kGpu, d_logits.ptr, d_losses.ptr, d_targets.ptr, 4, 10, 1.0f);
    FAIL() << "no error for target 10 of a vocabulary of 10";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target id 10"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d_logits.host(), logits);
}

TEST_F(CudaEntries, SumOfSquaresScaleAddAndAdamWOverManyTensorsMatchTheCpu) {
  for (int64_t n : {1, 4097, 3000001}) {
    const std::vector<float> x = random_values(seed_, n, 1.0f);
    DeviceFloats d_x(allocator_, x);
    const double want = sum_of_squares(kCpu, x.data(), n);
    EXPECT_NEAR(sum_of_squares(kGpu, d_x.ptr, n), want, 1e-12 * want) << n;  // both exact squares in fp64
    std::vector<float> scaled = x;
    scale_in_place(kCpu, scaled.data(), n, 0.37f);
    scale_in_place(kGpu, d_x.ptr, n, 0.37f);
    EXPECT_EQ(d_x.host(), scaled) << n;
    const std::vector<float> y = random_values(seed_ + 1, n, 1.0f);
    DeviceFloats d_y(allocator_, y);
    std::vector<float> sum = y;
    add_in_place(kCpu, sum.data(), scaled.data(), n);
    add_in_place(kGpu, d_y.ptr, d_x.ptr, n);
    EXPECT_EQ(d_y.host(), sum) << n;
  }
  // AdamW over 60 tensors of awkward sizes (two launches), every third with a step of its own (no
  // weight decay, another learning rate): the CPU update within 1e-6 (FMA, above).
  std::vector<std::vector<float>> p, g, m, v;
  std::vector<std::unique_ptr<DeviceFloats>> dp, dg, dm, dv;
  std::vector<AdamWTensor> cpu_tensors, gpu_tensors;
  for (int t = 0; t < 60; ++t) {
    const int64_t n = t % 7 == 0 ? 0 : (t * 7919) % 20000 + 1;
    p.push_back(random_values(seed_ + t, n, 0.5f));
    g.push_back(random_values(seed_ + 100 + t, n, 0.01f));
    m.push_back(random_values(seed_ + 200 + t, n, 0.001f));
    v.push_back(random_values(seed_ + 300 + t, n, 1e-5f));
    for (float& x : v.back()) x = std::fabs(x);
    dp.push_back(std::make_unique<DeviceFloats>(allocator_, p.back()));
    dg.push_back(std::make_unique<DeviceFloats>(allocator_, g.back()));
    dm.push_back(std::make_unique<DeviceFloats>(allocator_, m.back()));
    dv.push_back(std::make_unique<DeviceFloats>(allocator_, v.back()));
  }
  for (int t = 0; t < 60; ++t) {
    const int step_index = t % 3 == 0 ? 1 : 0;
    cpu_tensors.push_back({p[t].data(), g[t].data(), m[t].data(), v[t].data(), static_cast<int64_t>(p[t].size())});
    gpu_tensors.push_back({dp[t]->ptr, dg[t]->ptr, dm[t]->ptr, dv[t]->ptr, static_cast<int64_t>(p[t].size())});
    cpu_tensors.back().step_index = gpu_tensors.back().step_index = step_index;
  }
  const std::vector<AdamWStep> steps = {{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 11, 0.7f},
                                        {1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 11, 0.7f}};
  adamw_update_many(kCpu, cpu_tensors, steps);
  adamw_update_many(kGpu, gpu_tensors, steps);
  for (int t = 0; t < 60; ++t) {
    EXPECT_LE(relative_error(dp[t]->host(), p[t]), 1e-6) << "tensor " << t;
    EXPECT_LE(relative_error(dm[t]->host(), m[t]), 1e-6) << "tensor " << t;
    EXPECT_LE(relative_error(dv[t]->host(), v[t]), 1e-6) << "tensor " << t;
  }
}

// AdamW writing the bf16 copy of what it updates (AdamWTensor::param_bf16: the optimizer's copy of
// a bf16 model's parameters): the copy is the updated values rounded to nearest even bit for bit,
// through packs and, one element in (not 8-byte aligned), element by element; the updated values
// are those of the same update without a copy, bit for bit.
TEST_F(CudaEntries, AdamWWritesTheBf16CopyOfEachUpdatedValue) {
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 11, 0.7f};
  for (const int64_t shift : {0, 1}) {
    for (const int64_t n : {1, 4097, 300001}) {
      const std::vector<float> p = random_values(seed_ + n, n, 0.5f), g = random_values(seed_ + 1, n, 0.01f);
      const std::vector<float> m = random_values(seed_ + 2, n, 0.001f);
      std::vector<float> v = random_values(seed_ + 3, n, 1e-5f);
      for (float& x : v) x = std::fabs(x);
      DeviceFloats p1(allocator_, p), g1(allocator_, g), m1(allocator_, m), v1(allocator_, v);
      DeviceFloats p2(allocator_, p), m2(allocator_, m), v2(allocator_, v);
      DeviceArray<uint16_t> copy(allocator_, std::vector<uint16_t>(n + shift, 0xABCD));
      const std::vector<AdamWTensor> plain{{p1.ptr, g1.ptr, m1.ptr, v1.ptr, n}};
      const std::vector<AdamWTensor> copied{{p2.ptr, g1.ptr, m2.ptr, v2.ptr, n, copy.ptr + shift}};
      adamw_update_many(kGpu, plain, step);
      adamw_update_many(kGpu, copied, step);
      const std::vector<float> updated = p1.host();
      EXPECT_EQ(p2.host(), updated) << n;
      std::vector<uint16_t> want(n);
      narrow_floats(kCpu, want.data(), updated.data(), n, DType::BF16);
      const std::vector<uint16_t> got = copy.host();
      EXPECT_EQ(std::vector<uint16_t>(got.begin() + shift, got.end()), want) << n << " shift " << shift;
      if (shift == 1) {
        EXPECT_EQ(got[0], 0xABCD) << "the element before the copy";
      }
    }
  }
}

// bf16 and f16 copies (the bf16 gradient wire): rounded to nearest even bit for bit as the CPU
// rounds (values near the halfway points, subnormals, Inf), widened and accumulated exactly. A NaN
// stays a NaN (its payload bits are the hardware's: compared as "a NaN").
TEST_F(CudaEntries, HalfCopiesRoundAndWidenAsTheCpu) {
  for (DType dtype : {DType::BF16, DType::F16}) {
    const uint16_t exponent_mask = dtype == DType::BF16 ? 0x7f80 : 0x7c00;
    auto codes = [&](std::vector<uint16_t> c) {  // every NaN code as one
      for (uint16_t& x : c)
        if ((x & 0x7fff) > exponent_mask) x = 0x7fff;
      return c;
    };
    auto floats = [](const std::vector<float>& v) {  // bits, every NaN as one
      std::vector<uint32_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = std::isnan(v[i]) ? 0x7fffffffu : std::bit_cast<uint32_t>(v[i]);
      return b;
    };
    for (int64_t n : {1, 4097, 1000003}) {
      std::vector<float> x = random_values(seed_, n, 3.0f);
      const float specials[] = {INFINITY, -INFINITY, NAN, 1e-40f, -0.0f, 65504.0f, 65520.0f, 1.00390625f, 3e38f};
      for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < n; ++i) x[i * 7 % n] = specials[i];
      std::vector<uint16_t> narrow(n);
      narrow_floats(kCpu, narrow.data(), x.data(), n, dtype);
      DeviceFloats d_x(allocator_, x);
      DeviceArray<uint16_t> d_narrow(allocator_, std::vector<uint16_t>(n, 0x1234));
      narrow_floats(kGpu, d_narrow.ptr, d_x.ptr, n, dtype);
      EXPECT_EQ(codes(d_narrow.host()), codes(narrow)) << dtype_name(dtype) << " " << n;
      const std::vector<float> base = random_values(seed_ + 1, n, 1.0f);
      std::vector<float> widened(n), summed = base;
      widen_floats(kCpu, widened.data(), narrow.data(), n, dtype, false);
      widen_floats(kCpu, summed.data(), narrow.data(), n, dtype, true);
      DeviceFloats d_widened(allocator_, poison(n)), d_summed(allocator_, base);
      widen_floats(kGpu, d_widened.ptr, d_narrow.ptr, n, dtype, false);
      widen_floats(kGpu, d_summed.ptr, d_narrow.ptr, n, dtype, true);
      EXPECT_EQ(floats(d_widened.host()), floats(widened)) << dtype_name(dtype) << " " << n;
      EXPECT_EQ(floats(d_summed.host()), floats(summed)) << dtype_name(dtype) << " " << n;
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
