// The Mamba-2 mixer's CUDA kernels (kernels/cuda/causal_conv.cu, ssd_scan.cu, gated_norm.cu),
// called through kernels/ops.h on Device::cuda(0) and compared with the same entries on the CPU:
// fresh random inputs each run, on awkward shapes (a sequence not a multiple of the chunk, several
// documents packed per row, fewer groups than heads, head_dim 1 to 3, state 16 and 64, batch 1 to
// 3, strided rows), outputs poisoned, backward adding into non-zero gradients, decoding steps
// advancing non-zero states. fp32 within 1e-5 relative. Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "loom/kernels/cuda/ssd_chunk_scan.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceArray;
using testing::DeviceFloats;
using testing::poison;
using testing::random_values;
using testing::relative_error;

constexpr Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);
constexpr double kTolerance = 1e-5;

class CudaMamba : public testing::GpuTest<> {};

// The scan's forms on the GPU (ssd_chunk_scan.h): the (row, head) loops and the chunk-parallel
// batched products in double, each held to the CPU at fp32's tolerance, and in fp32 on TF32
// tensor cores, at bf16's (TF32 keeps 10 bits of mantissa).
constexpr std::array<SsdScanForm, 3> kScanForms{SsdScanForm::Loops, SsdScanForm::Chunks, SsdScanForm::ChunksTf32};
double tolerance_of(SsdScanForm form) { return form == SsdScanForm::ChunksTf32 ? 1e-2 : kTolerance; }
struct UsingScanForm {
  explicit UsingScanForm(SsdScanForm form) { set_ssd_scan_form(static_cast<int>(form)); }
  ~UsingScanForm() { set_ssd_scan_form(0); }
};
std::string form_name(SsdScanForm form) {
  return form == SsdScanForm::Chunks ? "chunks" : form == SsdScanForm::ChunksTf32 ? "chunks-tf32" : "loops";
}

// Document ids of [batch, seq] tokens: a new document with probability 1/6 per token, and one
// starting exactly at `aligned` in every row (a chunk's boundary).
std::vector<int32_t> packed_documents(uint32_t seed, int64_t batch, int64_t seq, int64_t aligned) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> die(0, 5);
  std::vector<int32_t> docs(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (t > 0 && (die(rng) == 0 || t == aligned)) ++id;
      docs[b * seq + t] = id;
    }
  }
  return docs;
}

std::string describe(const SsdShape& s, bool docs) {
  return "batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq) + " heads " + std::to_string(s.heads) +
         " head_dim " + std::to_string(s.head_dim) + " groups " + std::to_string(s.groups) + " state " +
         std::to_string(s.state) + " chunk " + std::to_string(s.chunk) + (docs ? " packed" : "");
}

// The scan's shapes: rows padded past their widths so that every stride matters.
std::vector<SsdShape> scan_shapes() {
  std::vector<SsdShape> shapes;
  auto add = [&](int64_t batch, int64_t seq, int64_t heads, int64_t P, int64_t groups, int64_t N, int64_t chunk) {
    shapes.push_back({batch, seq, heads, P, groups, N, chunk, heads * P + 3, heads + 2, groups * N + 5, heads * P + 1});
  };
  add(1, 1, 1, 1, 1, 16, 4);
  add(2, 13, 4, 3, 2, 16, 5);
  add(3, 37, 6, 2, 3, 64, 8);
  add(1, 70, 2, 1, 1, 64, 16);
  add(2, 45, 4, 16, 1, 16, 64);
  add(2, 50, 4, 8, 2, 64, 16);  // head_dim x state 512: the in-block loops over the state take two passes
  return shapes;
}

struct ScanOperands {
  std::vector<float> x, dt_raw, dt_bias, A_log, B, C, D;
  ScanOperands(uint32_t seed, const SsdShape& s) {
    const int64_t rows = s.batch * s.seq;
    x = random_values(seed, rows * s.x_stride, 1.0f);
    dt_raw = random_values(seed + 1, rows * s.dt_stride, 1.0f);
    dt_bias = random_values(seed + 2, s.heads, 0.5f);
    A_log = random_values(seed + 3, s.heads, 0.5f);
    B = random_values(seed + 4, rows * s.bc_stride, 1.0f);
    C = random_values(seed + 5, rows * s.bc_stride, 1.0f);
    D = random_values(seed + 6, s.heads, 1.0f);
  }
};

TEST_F(CudaMamba, SsdScanForwardAndBackwardMatchTheCpu) {
  for (const SsdShape& s : scan_shapes()) {
    for (bool packed : {false, true}) {
      SCOPED_TRACE(describe(s, packed));
      const int64_t rows = s.batch * s.seq;
      const ScanOperands in(seed_, s);
      const std::vector<int32_t> docs = packed_documents(seed_ + 7, s.batch, s.seq, s.chunk);
      const int32_t* cpu_docs = packed ? docs.data() : nullptr;
      const std::vector<float> dy = random_values(seed_ + 8, rows * s.y_stride, 1.0f);
      const std::vector<float> dx0 = random_values(seed_ + 9, rows * s.x_stride, 0.5f),
                               ddt0 = random_values(seed_ + 10, rows * s.dt_stride, 0.5f),
                               dB0 = random_values(seed_ + 11, rows * s.bc_stride, 0.5f),
                               dC0 = random_values(seed_ + 12, rows * s.bc_stride, 0.5f),
                               dh0 = random_values(seed_ + 13, 3 * s.heads, 0.5f);
      std::vector<float> y = poison(rows * s.y_stride), dx = dx0, ddt = ddt0, dB = dB0, dC = dC0, dh = dh0;
      ssd_scan_forward(kCpu, y.data(), in.x.data(), in.dt_raw.data(), in.dt_bias.data(), in.A_log.data(),
                       in.B.data(), in.C.data(), in.D.data(), s, cpu_docs);
      ssd_scan_backward(kCpu, dx.data(), ddt.data(), dh.data(), dh.data() + s.heads, dB.data(), dC.data(),
                        dh.data() + 2 * s.heads, dy.data(), in.x.data(), in.dt_raw.data(), in.dt_bias.data(),
                        in.A_log.data(), in.B.data(), in.C.data(), in.D.data(), s, cpu_docs);
      // The CPU's results once; each GPU form against them.
      for (SsdScanForm form : kScanForms) {
        const UsingScanForm use(form);
        SCOPED_TRACE(form_name(form));
        DeviceFloats d_x(allocator_, in.x), d_dt(allocator_, in.dt_raw), d_bias(allocator_, in.dt_bias),
            d_alog(allocator_, in.A_log), d_B(allocator_, in.B), d_C(allocator_, in.C), d_D(allocator_, in.D),
            d_dy(allocator_, dy), d_y(allocator_, poison(rows * s.y_stride)), d_dx(allocator_, dx0),
            d_ddt(allocator_, ddt0), d_dB(allocator_, dB0), d_dC(allocator_, dC0), d_dh(allocator_, dh0);
        DeviceArray<int32_t> d_docs(allocator_, docs);
        const int32_t* gpu_docs = packed ? d_docs.ptr : nullptr;
        ssd_scan_forward(kGpu, d_y.ptr, d_x.ptr, d_dt.ptr, d_bias.ptr, d_alog.ptr, d_B.ptr, d_C.ptr, d_D.ptr, s,
                         gpu_docs);
        ssd_scan_backward(kGpu, d_dx.ptr, d_ddt.ptr, d_dh.ptr, d_dh.ptr + s.heads, d_dB.ptr, d_dC.ptr,
                          d_dh.ptr + 2 * s.heads, d_dy.ptr, d_x.ptr, d_dt.ptr, d_bias.ptr, d_alog.ptr, d_B.ptr, d_C.ptr,
                          d_D.ptr, s, gpu_docs);
        // y's padding stays poisoned on both (NaN is skipped by relative_error where the CPU's is).
        EXPECT_LE(relative_error(d_y.host(), y), tolerance_of(form));
        EXPECT_LE(relative_error(d_dx.host(), dx), tolerance_of(form));
        EXPECT_LE(relative_error(d_ddt.host(), ddt), tolerance_of(form));
        EXPECT_LE(relative_error(d_dB.host(), dB), tolerance_of(form));
        EXPECT_LE(relative_error(d_dC.host(), dC), tolerance_of(form));
        EXPECT_LE(relative_error(d_dh.host(), dh), tolerance_of(form));
        // Nothing written into y's padding (still NaN where the CPU left it NaN).
        const std::vector<float> got_y = d_y.host();
        for (size_t i = 0; i < got_y.size(); ++i) {
          if (std::isnan(y[i]) && !std::isnan(got_y[i])) {
            ADD_FAILURE() << "y's padding written at " << i;
            break;
          }
        }
        // A second backward from the same starting gradients gives the same bits (no atomics).
        DeviceFloats again_dx(allocator_, dx0), again_ddt(allocator_, ddt0), again_dB(allocator_, dB0),
            again_dC(allocator_, dC0), again_dh(allocator_, dh0);
        ssd_scan_backward(kGpu, again_dx.ptr, again_ddt.ptr, again_dh.ptr, again_dh.ptr + s.heads, again_dB.ptr,
                          again_dC.ptr, again_dh.ptr + 2 * s.heads, d_dy.ptr, d_x.ptr, d_dt.ptr, d_bias.ptr, d_alog.ptr,
                          d_B.ptr, d_C.ptr, d_D.ptr, s, gpu_docs);
        EXPECT_EQ(again_dx.host(), d_dx.host());
        EXPECT_EQ(again_ddt.host(), d_ddt.host());
        EXPECT_EQ(again_dB.host(), d_dB.host());
        EXPECT_EQ(again_dC.host(), d_dC.host());
        EXPECT_EQ(again_dh.host(), d_dh.host());
      }
    }
  }
}

TEST_F(CudaMamba, SsdScanStepsMatchTheCpu) {
  for (SsdShape s : scan_shapes()) {
    s.seq = 1;
    SCOPED_TRACE(describe(s, false));
    const ScanOperands in(seed_, s);
    const int64_t state_size = s.batch * s.heads * s.head_dim * s.state;
    const std::vector<float> state0 = random_values(seed_ + 7, state_size, 1.0f);
    std::vector<float> y = poison(s.batch * s.y_stride), state = state0;
    DeviceFloats d_x(allocator_, in.x), d_dt(allocator_, in.dt_raw), d_bias(allocator_, in.dt_bias),
        d_alog(allocator_, in.A_log), d_B(allocator_, in.B), d_C(allocator_, in.C), d_D(allocator_, in.D),
        d_y(allocator_, y), d_state(allocator_, state0);
    for (int step = 0; step < 2; ++step) {  // the second step reads the state the first wrote
      ssd_scan_step(kCpu, y.data(), state.data(), nullptr, in.x.data(), in.dt_raw.data(), in.dt_bias.data(),
                    in.A_log.data(), in.B.data(), in.C.data(), in.D.data(), s);
      ssd_scan_step(kGpu, d_y.ptr, d_state.ptr, nullptr, d_x.ptr, d_dt.ptr, d_bias.ptr, d_alog.ptr, d_B.ptr, d_C.ptr,
                    d_D.ptr, s);
    }
    EXPECT_LE(relative_error(d_y.host(), y), kTolerance);
    EXPECT_LE(relative_error(d_state.host(), state), kTolerance);
  }
}

// A prompt's chunk through the step entry (s.seq tokens per sequence, the chunked scan from the
// state and back into it), twice: the second chunk continues the state the first left.
TEST_F(CudaMamba, SsdScanChunksContinuingTheStateMatchTheCpu) {
  for (const SsdShape& s : scan_shapes()) {
    for (SsdScanForm form : kScanForms) {
      const UsingScanForm use(form);
      SCOPED_TRACE(form_name(form));
      if (s.seq < 2) continue;
      SCOPED_TRACE(describe(s, false));
      const ScanOperands in(seed_, s);
      const int64_t state_size = s.batch * s.heads * s.head_dim * s.state;
      const std::vector<float> state0 = random_values(seed_ + 7, state_size, 1.0f);
      std::vector<float> y = poison(s.batch * s.seq * s.y_stride), state = state0;
      DeviceFloats d_x(allocator_, in.x), d_dt(allocator_, in.dt_raw), d_bias(allocator_, in.dt_bias),
          d_alog(allocator_, in.A_log), d_B(allocator_, in.B), d_C(allocator_, in.C), d_D(allocator_, in.D),
          d_y(allocator_, y), d_state(allocator_, state0);
      for (int chunk = 0; chunk < 2; ++chunk) {
        ssd_scan_step(kCpu, y.data(), state.data(), nullptr, in.x.data(), in.dt_raw.data(), in.dt_bias.data(),
                      in.A_log.data(), in.B.data(), in.C.data(), in.D.data(), s);
        ssd_scan_step(kGpu, d_y.ptr, d_state.ptr, nullptr, d_x.ptr, d_dt.ptr, d_bias.ptr, d_alog.ptr, d_B.ptr, d_C.ptr,
                      d_D.ptr, s);
        EXPECT_LE(relative_error(d_y.host(), y), tolerance_of(form)) << "chunk " << chunk;
        EXPECT_LE(relative_error(d_state.host(), state), tolerance_of(form)) << "chunk " << chunk;
      }
    }
  }
}

// Decoding sequences whose states and windows are a pool's slots (in another order than the rows,
// one slot left alone), one call each: the CPU's.
TEST_F(CudaMamba, StepsOverPoolSlotsMatchTheCpu) {
  for (SsdShape s : scan_shapes()) {
    s.seq = 1;
    SCOPED_TRACE(describe(s, false));
    const ScanOperands in(seed_, s);
    std::vector<int32_t> slots(static_cast<size_t>(s.batch));
    for (int64_t b = 0; b < s.batch; ++b) slots[static_cast<size_t>(b)] = static_cast<int32_t>(s.batch - b);
    const int64_t state_size = s.heads * s.head_dim * s.state;
    const std::vector<float> pool0 = random_values(seed_ + 7, (s.batch + 1) * state_size, 1.0f);
    std::vector<float> y = poison(s.batch * s.y_stride), pool = pool0;
    DeviceFloats d_x(allocator_, in.x), d_dt(allocator_, in.dt_raw), d_bias(allocator_, in.dt_bias),
        d_alog(allocator_, in.A_log), d_B(allocator_, in.B), d_C(allocator_, in.C), d_D(allocator_, in.D),
        d_y(allocator_, y), d_pool(allocator_, pool0);
    testing::DeviceArray<int32_t> d_slots(allocator_, slots);
    ssd_scan_step(kCpu, y.data(), pool.data(), slots.data(), in.x.data(), in.dt_raw.data(), in.dt_bias.data(),
                  in.A_log.data(), in.B.data(), in.C.data(), in.D.data(), s);
    ssd_scan_step(kGpu, d_y.ptr, d_pool.ptr, d_slots.ptr, d_x.ptr, d_dt.ptr, d_bias.ptr, d_alog.ptr, d_B.ptr, d_C.ptr,
                  d_D.ptr, s);
    EXPECT_LE(relative_error(d_y.host(), y), kTolerance);
    EXPECT_LE(relative_error(d_pool.host(), pool), kTolerance);
  }
}

std::vector<ConvShape> conv_shapes() {
  // {batch, seq, channels, kernel, in_stride, out_stride}; 9 taps: more than one pass of the
  // weight gradient's register taps.
  return {{1, 1, 1, 1, 1, 1}, {2, 13, 7, 4, 9, 8}, {3, 37, 130, 3, 133, 130}, {1, 300, 64, 4, 64, 70},
          {2, 21, 5, 9, 5, 5}, {2, 40, 600, 4, 610, 600}};  // 600 channels: the weight gradient's grid 3 blocks wide
}

std::string describe(const ConvShape& s, bool docs) {
  return "batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq) + " channels " +
         std::to_string(s.channels) + " kernel " + std::to_string(s.kernel) + (docs ? " packed" : "");
}

TEST_F(CudaMamba, CausalConvForwardAndBackwardMatchTheCpu) {
  for (const ConvShape& s : conv_shapes()) {
    for (bool packed : {false, true}) {
      SCOPED_TRACE(describe(s, packed));
      const int64_t rows = s.batch * s.seq;
      const std::vector<float> in = random_values(seed_, rows * s.in_stride, 1.0f),
                               w = random_values(seed_ + 1, s.channels * s.kernel, 0.5f),
                               bias = random_values(seed_ + 2, s.channels, 0.5f),
                               dout = random_values(seed_ + 3, rows * s.out_stride, 1.0f),
                               din0 = random_values(seed_ + 4, rows * s.in_stride, 0.5f),
                               dw0 = random_values(seed_ + 5, s.channels * s.kernel, 0.5f),
                               db0 = random_values(seed_ + 6, s.channels, 0.5f);
      const std::vector<int32_t> docs = packed_documents(seed_ + 7, s.batch, s.seq, s.kernel);
      const int32_t* cpu_docs = packed ? docs.data() : nullptr;
      std::vector<float> out = poison(rows * s.out_stride), din = din0, dw = dw0, db = db0;
      causal_conv_silu_forward(kCpu, out.data(), in.data(), w.data(), bias.data(), s, cpu_docs);
      causal_conv_silu_backward(kCpu, din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), bias.data(),
                                s, cpu_docs);
      DeviceFloats d_in(allocator_, in), d_w(allocator_, w), d_bias(allocator_, bias), d_dout(allocator_, dout),
          d_out(allocator_, poison(rows * s.out_stride)), d_din(allocator_, din0), d_dw(allocator_, dw0),
          d_db(allocator_, db0);
      DeviceArray<int32_t> d_docs(allocator_, docs);
      const int32_t* gpu_docs = packed ? d_docs.ptr : nullptr;
      causal_conv_silu_forward(kGpu, d_out.ptr, d_in.ptr, d_w.ptr, d_bias.ptr, s, gpu_docs);
      causal_conv_silu_backward(kGpu, d_din.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_in.ptr, d_w.ptr, d_bias.ptr, s,
                                gpu_docs);
      EXPECT_LE(relative_error(d_out.host(), out), kTolerance);
      EXPECT_LE(relative_error(d_din.host(), din), kTolerance);
      EXPECT_LE(relative_error(d_dw.host(), dw), kTolerance);
      EXPECT_LE(relative_error(d_db.host(), db), kTolerance);
      if (!packed) continue;
      // Without a bias (nor its gradient).
      std::vector<float> out_nb = poison(rows * s.out_stride), din_nb = din0, dw_nb = dw0;
      causal_conv_silu_forward(kCpu, out_nb.data(), in.data(), w.data(), nullptr, s, cpu_docs);
      causal_conv_silu_backward(kCpu, din_nb.data(), dw_nb.data(), nullptr, dout.data(), in.data(), w.data(), nullptr,
                                s, cpu_docs);
      DeviceFloats d_out_nb(allocator_, poison(rows * s.out_stride)), d_din_nb(allocator_, din0),
          d_dw_nb(allocator_, dw0);
      causal_conv_silu_forward(kGpu, d_out_nb.ptr, d_in.ptr, d_w.ptr, nullptr, s, gpu_docs);
      causal_conv_silu_backward(kGpu, d_din_nb.ptr, d_dw_nb.ptr, nullptr, d_dout.ptr, d_in.ptr, d_w.ptr, nullptr, s,
                                gpu_docs);
      EXPECT_LE(relative_error(d_out_nb.host(), out_nb), kTolerance) << "without a bias";
      EXPECT_LE(relative_error(d_din_nb.host(), din_nb), kTolerance) << "without a bias";
      EXPECT_LE(relative_error(d_dw_nb.host(), dw_nb), kTolerance) << "without a bias";
    }
  }
}

TEST_F(CudaMamba, CausalConvStepsMatchTheCpu) {
  for (ConvShape s : conv_shapes()) {
    s.seq = 1;
    SCOPED_TRACE(describe(s, false));
    const std::vector<float> in = random_values(seed_, s.batch * s.in_stride, 1.0f),
                             w = random_values(seed_ + 1, s.channels * s.kernel, 0.5f),
                             bias = random_values(seed_ + 2, s.channels, 0.5f),
                             window0 = random_values(seed_ + 3, s.batch * s.channels * (s.kernel - 1), 1.0f);
    std::vector<float> out = poison(s.batch * s.out_stride), window = window0;
    DeviceFloats d_in(allocator_, in), d_w(allocator_, w), d_bias(allocator_, bias), d_out(allocator_, out),
        d_window(allocator_, window0);
    for (int step = 0; step < 2; ++step) {
      causal_conv_silu_step(kCpu, out.data(), window.data(), nullptr, in.data(), w.data(), bias.data(), s);
      causal_conv_silu_step(kGpu, d_out.ptr, d_window.ptr, nullptr, d_in.ptr, d_w.ptr, d_bias.ptr, s);
    }
    EXPECT_LE(relative_error(d_out.host(), out), kTolerance);
    EXPECT_EQ(d_window.host(), window);  // shifted copies
  }
}

// A prompt's chunk through the step entry (s.seq tokens per sequence after the window's), twice:
// the second continues the window the first left (chunks longer and shorter than the window).
TEST_F(CudaMamba, CausalConvChunksContinuingTheWindowMatchTheCpu) {
  for (ConvShape s : conv_shapes()) {
    for (int64_t seq : {int64_t{2}, s.seq}) {
      if (seq < 2) continue;
      s.seq = seq;
      SCOPED_TRACE(describe(s, false));
      const std::vector<float> in = random_values(seed_, s.batch * s.seq * s.in_stride, 1.0f),
                               w = random_values(seed_ + 1, s.channels * s.kernel, 0.5f),
                               bias = random_values(seed_ + 2, s.channels, 0.5f),
                               window0 = random_values(seed_ + 3, s.batch * s.channels * (s.kernel - 1), 1.0f);
      std::vector<float> out = poison(s.batch * s.seq * s.out_stride), window = window0;
      DeviceFloats d_in(allocator_, in), d_w(allocator_, w), d_bias(allocator_, bias), d_out(allocator_, out),
          d_window(allocator_, window0);
      for (int chunk = 0; chunk < 2; ++chunk) {
        causal_conv_silu_step(kCpu, out.data(), window.data(), nullptr, in.data(), w.data(), bias.data(), s);
        causal_conv_silu_step(kGpu, d_out.ptr, d_window.ptr, nullptr, d_in.ptr, d_w.ptr, d_bias.ptr, s);
        EXPECT_LE(relative_error(d_out.host(), out), kTolerance) << "chunk " << chunk;
        EXPECT_EQ(d_window.host(), window) << "chunk " << chunk;  // shifted copies
      }
    }
  }
}

TEST_F(CudaMamba, GatedRmsNormForwardAndBackwardMatchTheCpu) {
  // {rows, dim, group_size, z_stride}
  for (auto [rows, dim, group, z_stride] : std::vector<std::array<int64_t, 4>>{
           {1, 1, 1, 1}, {37, 24, 8, 40}, {300, 512, 64, 1000}, {5, 96, 96, 96}, {1000, 48, 16, 50}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " dim " + std::to_string(dim) + " group " + std::to_string(group));
    const std::vector<float> y = random_values(seed_, rows * dim, 1.0f), z = random_values(seed_ + 1, rows * z_stride, 1.5f),
                             w = random_values(seed_ + 2, dim, 1.0f), dout = random_values(seed_ + 3, rows * dim, 1.0f),
                             dy0 = random_values(seed_ + 4, rows * dim, 0.5f),
                             dz0 = random_values(seed_ + 5, rows * z_stride, 0.5f),
                             dw0 = random_values(seed_ + 6, dim, 0.5f);
    const int64_t groups = dim / group;
    std::vector<float> out = poison(rows * dim), rstd = poison(rows * groups), dy = dy0, dz = dz0, dw = dw0;
    gated_rmsnorm_forward(kCpu, out.data(), rstd.data(), y.data(), z.data(), z_stride, w.data(), rows, dim, group, 1e-5f);
    gated_rmsnorm_backward(kCpu, dy.data(), dz.data(), dw.data(), dout.data(), y.data(), z.data(), z_stride, w.data(),
                           rstd.data(), rows, dim, group);
    DeviceFloats d_y(allocator_, y), d_z(allocator_, z), d_w(allocator_, w), d_dout(allocator_, dout),
        d_out(allocator_, poison(rows * dim)), d_rstd(allocator_, poison(rows * groups)), d_dy(allocator_, dy0),
        d_dz(allocator_, dz0), d_dw(allocator_, dw0);
    gated_rmsnorm_forward(kGpu, d_out.ptr, d_rstd.ptr, d_y.ptr, d_z.ptr, z_stride, d_w.ptr, rows, dim, group, 1e-5f);
    gated_rmsnorm_backward(kGpu, d_dy.ptr, d_dz.ptr, d_dw.ptr, d_dout.ptr, d_y.ptr, d_z.ptr, z_stride, d_w.ptr,
                           d_rstd.ptr, rows, dim, group);
    EXPECT_LE(relative_error(d_out.host(), out), kTolerance);
    EXPECT_LE(relative_error(d_rstd.host(), rstd), kTolerance);
    EXPECT_LE(relative_error(d_dy.host(), dy), kTolerance);
    EXPECT_LE(relative_error(d_dz.host(), dz), kTolerance);
    EXPECT_LE(relative_error(d_dw.host(), dw), kTolerance);
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
