// The CUDA kernels against the CPU path (METHOD: fresh random inputs, outputs poisoned before
// each run, every element checked): AdamW within 1e-6 of kernels::cpu::adamw_update (the CPU build may
// contract to FMA), RMSNorm forward
// and backward within fp32 rounding of the CPU (the weight gradient's row sum is accumulated in
// another order), SwiGLU and GELU forward and backward within 1e-5 (expf against the CPU's
// polynomial exp; backward writes its gradient whole, as on the CPU); the norms' weight gradients
// over many rows the same bits on every run and within 1e-6 of fp64. Without a usable GPU every
// test skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/adamw.h"
#include "loom/kernels/cpu/norm.h"
#include "loom/kernels/cpu/rows.h"
#include "loom/kernels/types.h"
#include "loom/kernels/cuda/activation.h"
#include "loom/kernels/cuda/adamw.h"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/layernorm.h"
#include "loom/kernels/cuda/rmsnorm.h"
#include "loom/kernels/cuda/rope.h"
#include "loom/kernels/cuda/rows.h"
#include "loom/kernels/cuda/zero_runs.h"
#include "cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceFloats;
using testing::random_values;
using testing::relative_error;
using DeviceArray = DeviceFloats;

TEST(CudaDevice, StatusSaysWhyWhenThereIsNoGpu) {
  const DeviceStatus& s = device_status();
  if (s.available) {
    EXPECT_GT(s.devices, 0);
  } else {
    EXPECT_FALSE(s.reason.empty());
  }
}

TEST(CudaKernels, AdamWEqualsTheCpuUpdate) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (int64_t n : {1, 1000, 1 << 20}) {
    for (uint32_t trial = 0; trial < 2; ++trial) {
      const std::vector<float> p0 = random_values(1 + trial, n, 0.5f), g = random_values(2 + trial, n, 1e-2f);
      std::vector<float> m = random_values(3 + trial, n, 1e-3f), v = random_values(4 + trial, n, 1e-5f);
      for (float& x : v) x = std::fabs(x);
      const cpu::AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f};
      DeviceArray dp(allocator, p0), dg(allocator, g), dm(allocator, m), dv(allocator, v);
      std::vector<float> p = p0;
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, step);
      cuda::adamw_update(dp.ptr, dg.ptr, dm.ptr, dv.ptr, n, step);
      check_cuda(cudaDeviceSynchronize(), "adamw");
      EXPECT_LE(relative_error(dp.host(), p), 1e-6) << "n " << n;
      EXPECT_LE(relative_error(dm.host(), m), 1e-6) << "n " << n;
      EXPECT_LE(relative_error(dv.host(), v), 1e-6) << "n " << n;
    }
  }
  EXPECT_GT(allocator.stats().reuses, 0);  // the second trial's buffers came from the cache
}

TEST(CudaKernels, RmsNormForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 7}, {37, 256}, {64, 2048}}) {
    const std::vector<float> x = random_values(11, rows * dim, 1.0f), w = random_values(12, dim, 1.0f),
                             dy = random_values(13, rows * dim, 1.0f);
    std::vector<float> out(x.size()), rstd(static_cast<size_t>(rows)), dx(x.size(), 0.25f), dw(w.size(), 0.5f);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
    const std::vector<float> poison(x.size(), NAN), poison_rows(static_cast<size_t>(rows), NAN);
    DeviceArray d_x(allocator, x), d_w(allocator, w), d_dy(allocator, dy), d_out(allocator, poison),
        d_rstd(allocator, poison_rows), d_dx(allocator, std::vector<float>(x.size(), 0.25f)),
        d_dw(allocator, std::vector<float>(w.size(), 0.5f));
    cuda::rmsnorm_forward(d_out.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, rows, dim, 1e-5f);
    cuda::rmsnorm_backward(d_dx.ptr, d_dw.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_rstd.ptr, rows, dim, nullptr, nullptr);
    check_cuda(cudaDeviceSynchronize(), "rmsnorm");
    EXPECT_LE(relative_error(d_out.host(), out), 1e-6) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_rstd.host(), rstd), 1e-6) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_dx.host(), dx), 1e-5) << rows << " x " << dim;
    EXPECT_LE(relative_error(d_dw.host(), dw), 1e-5) << rows << " x " << dim;
  }
}

// The norms' weight (and bias) gradients are summed per run of rows and the runs in a fixed order,
// with no atomics: two runs give the same bits, within 1e-6 of the sums in fp64. The shapes take
// runs of more than 16 rows (past 16384 rows) and shared memory beyond the default 48 KB (16384
// columns: 64 KB for RMSNorm, 128 KB for LayerNorm's two arrays; 12288: RMSNorm's 48 KB array
// and its static reduction buffer just past it).
TEST(CudaKernels, NormWeightGradientsAreDeterministicAndExactOverManyRows) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{20000, 40}, {3, 16384}, {5, 12288}, {1000, 768}}) {
    const std::vector<float> x = random_values(61, rows * dim, 1.0f), w = random_values(62, dim, 1.0f),
                             dy = random_values(63, rows * dim, 1.0f), dw0 = random_values(64, dim, 0.5f);
    std::vector<float> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
    std::vector<double> rms_dw(dw0.begin(), dw0.end()), ln_dw(dw0.begin(), dw0.end()), ln_db(dw0.begin(), dw0.end());
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0, sum_sq = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum += x[r * dim + i];
      mean[r] = static_cast<float>(sum / dim);
      for (int64_t i = 0; i < dim; ++i) sum_sq += (x[r * dim + i] - mean[r]) * (x[r * dim + i] - mean[r]);
      rstd[r] = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + 1e-5));
      for (int64_t i = 0; i < dim; ++i) {
        const double g = dy[r * dim + i], xv = x[r * dim + i];
        rms_dw[i] += g * xv * rstd[r];  // RMSNorm reads rstd as its 1 / rms (any positive row scale)
        ln_dw[i] += g * (xv - mean[r]) * rstd[r];
        ln_db[i] += g;
      }
    }
    DeviceArray d_x(allocator, x), d_w(allocator, w), d_dy(allocator, dy), d_mean(allocator, mean),
        d_rstd(allocator, rstd);
    std::vector<float> first_rms, first_ln_w, first_ln_b;
    for (int run = 0; run < 2; ++run) {
      DeviceArray d_dx(allocator, std::vector<float>(x.size(), 0.0f)), d_dw(allocator, dw0),
          d_ln_dw(allocator, dw0), d_ln_db(allocator, dw0);
      rmsnorm_backward(d_dx.ptr, d_dw.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_rstd.ptr, rows, dim, nullptr, nullptr);
      layernorm_backward(d_dx.ptr, d_ln_dw.ptr, d_ln_db.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr, rows,
                         dim, nullptr, nullptr);
      check_cuda(cudaDeviceSynchronize(), "norm backward");
      const std::vector<float> rms = d_dw.host(), ln_w = d_ln_dw.host(), ln_b = d_ln_db.host();
      EXPECT_LE(relative_error(rms, rms_dw), 1e-6) << rows << " x " << dim;
      EXPECT_LE(relative_error(ln_w, ln_dw), 1e-6) << rows << " x " << dim;
      EXPECT_LE(relative_error(ln_b, ln_db), 1e-6) << rows << " x " << dim;
      if (run == 0) {
        first_rms = rms, first_ln_w = ln_w, first_ln_b = ln_b;
      } else {
        EXPECT_EQ(rms, first_rms) << rows << " x " << dim;
        EXPECT_EQ(ln_w, first_ln_w) << rows << " x " << dim;
        EXPECT_EQ(ln_b, first_ln_b) << rows << " x " << dim;
      }
    }
  }
}

// SwiGLU forward and backward at rows x width against the CPU, both device outputs poisoned with
// NaN (the backward writes its gradient whole), every element checked.
void expect_swiglu_matches_the_cpu(CachingAllocator& allocator, int64_t rows, int64_t width, uint32_t seed) {
  const std::vector<float> gate_up = random_values(seed, rows * 2 * width, 2.0f);
  const std::vector<float> dy = random_values(seed + 1, rows * width, 1.0f);
  std::vector<float> out(static_cast<size_t>(rows * width)), dgu(static_cast<size_t>(rows * 2 * width));
  cpu::swiglu_forward(out.data(), gate_up.data(), rows, width);
  cpu::swiglu_backward(dgu.data(), dy.data(), gate_up.data(), rows, width);
  DeviceArray d_gu(allocator, gate_up), d_dy(allocator, dy), d_out(allocator, std::vector<float>(out.size(), NAN)),
      d_dgu(allocator, std::vector<float>(dgu.size(), NAN));
  cuda::swiglu_forward(d_out.ptr, d_gu.ptr, rows, width);
  cuda::swiglu_backward(d_dgu.ptr, d_dy.ptr, d_gu.ptr, rows, width);
  check_cuda(cudaDeviceSynchronize(), "swiglu");
  EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << rows << " x " << width;
  EXPECT_LE(relative_error(d_dgu.host(), dgu), 1e-5) << rows << " x " << width;
}

TEST(CudaKernels, SwigluForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {257, 1024}})
    expect_swiglu_matches_the_cpu(allocator, rows, width, 21);
}

// The row-by-row launches (launch_over_rows) past what one grid holds: more rows than a grid's
// 65535 block rows, and a row wider than 65535 blocks of 256 threads, so both loops stride.
TEST(CudaKernels, RowByRowKernelsCoverMoreRowsAndColumnsThanOneGrid) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  expect_swiglu_matches_the_cpu(allocator, 70001, 3, 24);
  expect_swiglu_matches_the_cpu(allocator, 1, 65535 * 256 + 77, 24);
}

TEST(CudaKernels, GeluForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (int64_t n : {1, 1001, 1 << 20}) {
    const std::vector<float> x = random_values(31, n, 3.0f), dy = random_values(32, n, 1.0f),
                             dx0 = random_values(33, n, 0.5f);
    std::vector<float> out(static_cast<size_t>(n)), dx = dx0;
    cpu::gelu_forward(out.data(), x.data(), n);
    cpu::gelu_backward(dx.data(), dy.data(), x.data(), n);
    DeviceArray d_x(allocator, x), d_dy(allocator, dy), d_out(allocator, std::vector<float>(out.size(), NAN)),
        d_dx(allocator, dx0);
    cuda::gelu_forward(d_out.ptr, d_x.ptr, n);
    cuda::gelu_backward(d_dx.ptr, d_dy.ptr, d_x.ptr, n);
    check_cuda(cudaDeviceSynchronize(), "gelu");
    EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << "n " << n;
    EXPECT_LE(relative_error(d_dx.host(), dx), 1e-5) << "n " << n;
  }
}

// Squared ReLU: the forward bit for bit; the backward (2 x dout, each product rounded) within 1e-6.
// The backwards write their gradients whole: the random values the device's start from are poison.
TEST(CudaKernels, Relu2ForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  for (int64_t n : {1, 1001, 1 << 20}) {
    const std::vector<float> x = random_values(41, n, 3.0f), dy = random_values(42, n, 1.0f),
                             dx0 = random_values(43, n, 0.5f);
    std::vector<float> out(static_cast<size_t>(n)), dx = dx0;
    cpu::relu2_forward(out.data(), x.data(), n);
    cpu::relu2_backward(dx.data(), dy.data(), x.data(), n);
    DeviceArray d_x(allocator, x), d_dy(allocator, dy), d_out(allocator, std::vector<float>(out.size(), NAN)),
        d_dx(allocator, dx0);
    cuda::relu2_forward(d_out.ptr, d_x.ptr, n);
    cuda::relu2_backward(d_dx.ptr, d_dy.ptr, d_x.ptr, n);
    check_cuda(cudaDeviceSynchronize(), "relu2");
    EXPECT_EQ(d_out.host(), out) << "n " << n;
    EXPECT_LE(relative_error(d_dx.host(), dx), 1e-6) << "n " << n;
  }
}

// A column block added into another (context parallelism's gradients): bit for bit the CPU's;
// also past a grid's 65535 block rows (launch_over_rows strides them).
TEST(CudaKernels, AddRowsEqualsTheCpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  struct Case {
    int64_t rows, width, y_stride, x_stride, y_at, x_at;
  };
  for (const Case c : {Case{1037, 64, 200, 72, 17, 3}, Case{70001, 5, 9, 9, 2, 1}}) {
    const std::vector<float> y0 = random_values(51, c.rows * c.y_stride, 1.0f),
                             x = random_values(52, c.rows * c.x_stride, 1.0f);
    std::vector<float> y = y0;
    cpu::add_rows(y.data() + c.y_at, c.y_stride, x.data() + c.x_at, c.x_stride, c.rows, c.width);
    DeviceArray d_y(allocator, y0), d_x(allocator, x);
    cuda::add_rows(d_y.ptr + c.y_at, c.y_stride, d_x.ptr + c.x_at, c.x_stride, c.rows, c.width);
    check_cuda(cudaDeviceSynchronize(), "add_rows");
    EXPECT_EQ(d_y.host(), y) << c.rows << " rows";
  }
}

// Many runs of a poisoned buffer zeroed in one call (a gradient buffer around the ranges its GEMMs
// write whole): runs at every alignment, empty ones, one of millions of elements (a launch of its
// own), more small runs than one launch takes; every element outside them keeps its poison.
TEST(CudaKernels, ZeroRunsZeroTheirRunsAndNothingElse) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  std::vector<FloatRun> runs;
  int64_t at = 1;
  for (int i = 0; i < 2 * kMaxZeroRunsPerLaunch + 7; ++i) {
    const int64_t n = i == 5 ? 3'000'001 : (i % 11 == 0 ? 0 : 1 + (i * 37) % 29);
    runs.push_back({at, n});
    at += n + 1 + i % 4;  // gaps of 1 to 4: every alignment of the next run
  }
  std::vector<float> want(static_cast<size_t>(at + 3), NAN);
  for (const FloatRun& r : runs) std::fill_n(want.begin() + r.begin, r.n, 0.0f);
  DeviceArray d(allocator, std::vector<float>(want.size(), NAN));
  cuda::zero_runs(d.ptr, runs.data(), static_cast<int64_t>(runs.size()));
  check_cuda(cudaDeviceSynchronize(), "zero_runs");
  const std::vector<float> got = d.host();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "element " << i;
    if (!std::isnan(want[i])) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), 0u) << "element " << i;
    }
  }
}

// RoPE undone from bf16 gradients into an fp32 one written whole (Attention's q/k gradient from
// cuDNN's bf16 ones under per-tensor FP8): bit for bit the widened rows added into zeroed ones
// (-0 becomes +0) and rotated back there, by rows' positions or by row % seq, into a strided
// destination whose other columns keep their poison; rows in packs of four pairs (a stride that
// is a multiple of 4) and pair by pair (an odd one). The amax the same pass takes (fp8_current's
// for the projection's cast) is the max |v| written, bit for bit, its grid capped (2500 rows: past
// the block rows amax_capped allows, so blocks walk several rows each).
TEST(CudaKernels, RopeBackwardWidenedIsTheAddIntoZerosRotated) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  const int64_t rows = 2500, heads = 5, head_dim = 64, seq = 100, width = heads * head_dim;
  const kernels::RopeTable table(seq, head_dim, 10000.0);
  DeviceFloats cos(allocator, table.cos), sin(allocator, table.sin);
  const DeviceRopeTable t{cos.ptr, sin.ptr, head_dim};
  std::vector<float> src = random_values(61, rows * width, 1.0f);
  for (int64_t i = 0; i < rows * width; i += 7) src[static_cast<size_t>(i)] = -0.0f;
  testing::DeviceArray<__nv_bfloat16> src16(allocator, testing::to_bf16(src));
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[static_cast<size_t>(r)] = static_cast<int32_t>((r * 37) % seq);
  testing::DeviceArray<int32_t> d_positions(allocator, positions);
  for (const int64_t stride : {width + 24, width + 1}) {
    for (const bool packed : {false, true}) {
      const std::string name = std::string(packed ? "positions given" : "positions by row") + ", stride " +
                               std::to_string(stride);
      const int32_t* at = packed ? d_positions.ptr : nullptr;
      std::vector<float> zeroed(rows * stride, -7.0f);
      for (int64_t r = 0; r < rows; ++r) std::fill_n(zeroed.begin() + r * stride + 8, width, 0.0f);
      DeviceFloats want(allocator, zeroed), got(allocator, std::vector<float>(rows * stride, -7.0f)),
          amax(allocator, std::vector<float>{0.0f});
      add_bf16_rows(want.ptr + 8, stride, src16.ptr, width, rows, width);
      rope_backward(want.ptr + 8, rows, stride, 0, heads, seq, 0, t, at);
      rope_backward_widened(got.ptr + 8, stride, src16.ptr, width, rows, heads, seq, t, at, amax.ptr);
      check_cuda(cudaDeviceSynchronize(), "rope_backward_widened");
      const std::vector<float> w = want.host(), g = got.host();
      int64_t different = 0;
      float largest = 0.0f;
      for (size_t i = 0; i < w.size(); ++i) {
        different += std::bit_cast<uint32_t>(w[i]) != std::bit_cast<uint32_t>(g[i]);
        if (w[i] != -7.0f) largest = std::max(largest, std::fabs(w[i]));
      }
      EXPECT_EQ(different, 0) << name;
      EXPECT_EQ(std::bit_cast<uint32_t>(amax.host()[0]), std::bit_cast<uint32_t>(largest)) << name << ": amax";
    }
  }
}

// A mixture of experts' row moves: a gather by index with a per-row scale (exact; a negative
// index a zero row), a scatter-add with repeated targets in row order, and per-row dot products in
// double (within 1e-6: the CPU build may or may not contract to FMA).
TEST(CudaKernels, RowGathersScattersAndDotsEqualTheCpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator;
  const int64_t rows = 1037, targets = 300, width = 72;
  std::vector<int32_t> index(rows);
  std::mt19937 rng(61);
  for (int32_t& i : index) i = static_cast<int32_t>(rng() % targets);
  std::vector<int32_t> padding = index;  // every seventh row a zero row (the experts' padding)
  for (size_t r = 0; r < padding.size(); r += 7) padding[r] = -1;
  const std::vector<float> x = random_values(62, targets * width, 1.0f);
  const std::vector<float> rows_in = random_values(63, rows * width, 1.0f), scale = random_values(64, rows, 1.0f);
  const std::vector<float> out0 = random_values(65, targets * width, 1.0f);
  DeviceArray d_x(allocator, x), d_rows(allocator, rows_in), d_scale(allocator, scale);
  testing::DeviceArray<int32_t> d_index(allocator, index);
  for (const bool scaled : {false, true}) {
    const float* s = scaled ? scale.data() : nullptr;
    const float* ds = scaled ? d_scale.ptr : nullptr;
    std::vector<float> gathered(rows * width), sum = out0;
    cpu::gather_rows(gathered.data(), x.data(), index.data(), s, rows, width);
    cpu::scatter_add_rows(sum.data(), rows_in.data(), width, index.data(), s, rows, width);
    DeviceArray d_gathered(allocator, std::vector<float>(gathered.size(), NAN)), d_sum(allocator, out0);
    cuda::gather_rows(d_gathered.ptr, d_x.ptr, d_index.ptr, ds, rows, width);
    cuda::scatter_add_rows(d_sum.ptr, d_rows.ptr, width, d_index.ptr, ds, rows, width);
    EXPECT_EQ(d_gathered.host(), gathered) << "scaled " << scaled;
    // A negative index gathers a row of zeros, as on the CPU.
    std::vector<float> padded(rows * width, NAN);
    cpu::gather_rows(padded.data(), x.data(), padding.data(), s, rows, width);
    EXPECT_EQ(padded[0], 0.0f);
    DeviceArray d_padded(allocator, std::vector<float>(padded.size(), NAN));
    testing::DeviceArray<int32_t> d_padding(allocator, padding);
    cuda::gather_rows(d_padded.ptr, d_x.ptr, d_padding.ptr, ds, rows, width);
    EXPECT_EQ(d_padded.host(), padded) << "scaled " << scaled;
    // Unscaled: one rounded add per row in row order, the CPU's bits; scaled within 1e-6 (the CPU
    // build may or may not contract to FMA).
    if (scaled) {
      EXPECT_LE(relative_error(d_sum.host(), sum), 1e-6);
    } else {
      EXPECT_EQ(d_sum.host(), sum);
    }
  }
  // Every row into one target, and past 65535 rows: the sorted groups' longest walk and the
  // launch's row stride.
  for (const int64_t many : {int64_t{5000}, int64_t{70001}}) {
    const int64_t w = 40;
    std::vector<int32_t> one_target(static_cast<size_t>(many), 0);
    if (many > 5000) one_target = testing::random_ids(67, many, 0, 9);
    const std::vector<float> src = random_values(68, many * w, 1.0f), into0 = random_values(69, 10 * w, 1.0f);
    std::vector<float> into = into0;
    cpu::scatter_add_rows(into.data(), src.data(), w, one_target.data(), nullptr, many, w);
    DeviceArray d_src(allocator, src), d_into(allocator, into0);
    testing::DeviceArray<int32_t> d_targets(allocator, one_target);
    cuda::scatter_add_rows(d_into.ptr, d_src.ptr, w, d_targets.ptr, nullptr, many, w);
    EXPECT_EQ(d_into.host(), into) << many << " rows";
  }
  // One broadcast row (stride 0) added into every row, no index.
  std::vector<float> broadcast = rows_in;
  cpu::scatter_add_rows(broadcast.data(), x.data(), 0, nullptr, scale.data(), rows, width);
  DeviceArray d_broadcast(allocator, rows_in);
  cuda::scatter_add_rows(d_broadcast.ptr, d_x.ptr, 0, nullptr, d_scale.ptr, rows, width);
  EXPECT_LE(relative_error(d_broadcast.host(), broadcast), 1e-6);
  // Row r added into row r (no index, a row stride): a thread per element on the GPU.
  const std::vector<float> own0 = random_values(66, rows * width, 1.0f);
  std::vector<float> own = own0;
  cpu::scatter_add_rows(own.data(), rows_in.data(), width, nullptr, scale.data(), rows, width);
  DeviceArray d_own(allocator, own0);
  cuda::scatter_add_rows(d_own.ptr, d_rows.ptr, width, nullptr, d_scale.ptr, rows, width);
  EXPECT_LE(relative_error(d_own.host(), own), 1e-6);
  std::vector<double> dots(rows), dots_broadcast(rows);
  cpu::row_dots(dots.data(), x.data(), index.data(), rows_in.data(), width, rows, width);
  cpu::row_dots(dots_broadcast.data(), rows_in.data(), nullptr, x.data(), 0, rows, width);
  testing::DeviceArray<double> d_dots(allocator, std::vector<double>(rows, NAN)),
      d_dots_broadcast(allocator, std::vector<double>(rows, NAN));
  cuda::row_dots(d_dots.ptr, d_x.ptr, d_index.ptr, d_rows.ptr, width, rows, width);
  cuda::row_dots(d_dots_broadcast.ptr, d_rows.ptr, nullptr, d_x.ptr, 0, rows, width);
  EXPECT_LE(relative_error(d_dots.host(), dots), 1e-6);
  EXPECT_LE(relative_error(d_dots_broadcast.host(), dots_broadcast), 1e-6);
}

}  // namespace
}  // namespace loom::kernels::cuda
