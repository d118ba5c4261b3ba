// Per-tensor FP8 casts of a training step to codes in both orientations (the packed transposed
// cast, kernels/cuda/tiled_cast.cuh) at a ~1B Llama-style model's shapes with 8192 tokens per step
// (d_model 2048, SwiGLU width 8192, k/v width 512), each with 64- and 128-row tiles
// (set_tiled_cast_rows, kernels/cuda/cast.h) and as each recipe runs it: fp8_current with the
// scale from a device amax given, fp8_delayed with a host scale and the amax taken by the cast
// (amax_out). Rows:
// - weight: fp32 [out, in] -> E4M3 [out, in] and [in, out], as a per-tensor FP8 forward casts a
//   weight into its two stores (precision_gemm.cpp's fp8_keeping_transpose: the scale pair
//   written beside the transposed codes and the plain ones by one launch, then cast_operand_both);
//   bytes: 4 read + 2 x 1 written per element;
// - bf16 activation: [8192, 2048] -> E4M3 both ways (cast_operand_both_bf16, as an activation kept
//   in bf16 is cast); 2 read + 2 x 1 written per element;
// - swiglu forward codes: kernels::activation_forward_codes, E4M3 [8192, 8192] from the bf16
//   [gate | up] input; 2 x 2 read + 2 x 1 written per output element;
// - swiglu backward codes: kernels::activation_backward_codes, E5M2 [8192, 16384] (gate and up
//   gradients) from gate, up and the output gradient; 3 x 2 read + 2 x 2 x 1 written per element
//   of the [8192, 8192] output gradient.
// Bytes count each read and write once (the scales' few bytes left out). The peer is
// cudaMemcpyAsync device to device of half the bytes (reading and writing that half). Both are
// timed alike: mean ms of 20 runs after 3 warm-ups. The small weights (6 MB for k, v) fit in the
// 50 MB L2, so their casts and copies may beat DRAM's bandwidth. Random data (uniform in [-1, 1)).
// Usage: loom_bench_cast_cuda
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/ops.h"

namespace {

using loom::Device;
using loom::bench::random_device_floats;
using loom::bench::time_ms;
using loom::kernels::CastOperand;
using loom::kernels::OperandCast;
using loom::kernels::cuda::check_cuda;

constexpr int64_t kTokens = 8192, kModel = 2048, kHidden = 8192, kKv = 512;
// fp8_delayed's host scale and fp8_current's amax: codes over E4M3's whole range for |x| < 1.
constexpr float kDelayedScale = 256.0f, kCurrentAmax = 1.0f;

const Device kGpu = Device::cuda(0);

void* device_bytes(int64_t n) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, static_cast<size_t>(n)), "cudaMalloc");
  return p;
}

float* device_float(float value) {
  auto* p = static_cast<float*>(device_bytes(sizeof(float)));
  check_cuda(cudaMemcpy(p, &value, sizeof value, cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

// n random bf16 values on the device (bench_util's floats, rounded).
void* random_device_bf16(int64_t n, uint64_t seed) {
  float* values = random_device_floats(n, seed);
  void* out = device_bytes(2 * n);
  loom::kernels::narrow_floats(kGpu, out, values, n, loom::DType::BF16);
  check_cuda(cudaDeviceSynchronize(), "bf16 inputs");
  cudaFree(values);
  return out;
}

std::string shape_of(int64_t rows, int64_t cols) { return std::to_string(rows) + "x" + std::to_string(cols); }

// One measured cast: cast(current) runs it as fp8_current (true) or fp8_delayed (false).
struct Case {
  std::string operation, shape;
  double bytes = 0;
  std::function<void(bool current)> cast;
};

// The device buffers the cases share: the amax fp8_current's scale comes from, the amax
// fp8_delayed's casts take, and the copy peer's source and destination.
struct Shared {
  float* amax = device_float(kCurrentAmax);
  float* taken = device_float(0.0f);
  void* copy_from = nullptr;
  void* copy_to = nullptr;
  cudaStream_t stream = loom::kernels::cuda::compute_stream(0);
};

CastOperand produced_cast(const Shared& shared, bool current, bool e5m2) {
  CastOperand cast;
  cast.cast = OperandCast::Fp8Tensor;
  cast.e5m2 = e5m2;
  cast.scale = kDelayedScale;
  cast.amax = current ? shared.amax : nullptr;
  if (!current) cast.amax_out = shared.taken;
  return cast;
}

void print_row(const std::string& variant, const Case& c, double ms, double copy_tbs) {
  const double tbs = c.bytes / (ms * 1e-3) / 1e12;
  std::printf("CAST|%s|%s|%s|%.4f|%.4f|%.3f|%.3f|%.3f\n", variant.c_str(), c.operation.c_str(), c.shape.c_str(), ms,
              c.bytes / 1e9, tbs, copy_tbs, tbs / copy_tbs);
  std::fflush(stdout);
}

// The case's copy peer once, then the case with each tile height and recipe.
void measure(const Case& c, const Shared& shared) {
  const auto half = static_cast<size_t>(c.bytes / 2);
  const double copy_ms = time_ms([&] {
    check_cuda(cudaMemcpyAsync(shared.copy_to, shared.copy_from, half, cudaMemcpyDeviceToDevice, shared.stream),
               "cudaMemcpyAsync");
  });
  const double copy_tbs = c.bytes / (copy_ms * 1e-3) / 1e12;
  for (const int tile_rows : {64, 128}) {
    loom::kernels::cuda::set_tiled_cast_rows(tile_rows);
    for (const bool current : {true, false}) {
      const double ms = time_ms([&] { c.cast(current); });
      print_row(std::to_string(tile_rows) + "-row " + (current ? "fp8_current" : "fp8_delayed"), c, ms, copy_tbs);
    }
  }
  loom::kernels::cuda::set_tiled_cast_rows(0);
}

// A tensor [rows, cols] (fp32, or bf16 when `bf16`) cast to E4M3 both ways as a per-tensor FP8
// linear layer casts it: the scale pair beside the transposed codes and, when `weight` (into its
// store), beside the plain ones, then one pass writing both.
void measure_operand(const std::string& operation, int64_t rows, int64_t cols, bool bf16, bool weight,
                     const Shared& shared) {
  namespace cuda = loom::kernels::cuda;
  const int64_t n = rows * cols;
  void* in = bf16 ? random_device_bf16(n, 1) : random_device_floats(n, 1);
  const int64_t bytes = loom::kernels::weight_cast_layout(OperandCast::Fp8Tensor, rows, cols).bytes;
  const int64_t offset = loom::kernels::weight_cast_layout(OperandCast::Fp8Tensor, rows, cols).scale_offset;
  auto* codes = static_cast<uint8_t*>(device_bytes(bytes));
  auto* transposed = static_cast<uint8_t*>(device_bytes(bytes));
  Case c{operation, shape_of(rows, cols), static_cast<double>(n) * ((bf16 ? 2 : 4) + 2), {}};
  c.cast = [&](bool current) {
    const CastOperand op = produced_cast(shared, current, false);
    auto* scale = reinterpret_cast<float*>(transposed + offset);
    cuda::fp8_tensor_scale_twice(op.amax, op.scale, op.margin, cuda::Fp8::E4M3, scale,
                                 weight ? reinterpret_cast<float*>(codes + offset) : nullptr, shared.stream);
    if (bf16) {
      cuda::cast_operand_both_bf16(in, codes, transposed, rows, cols, cuda::CastTo::E4M3, scale, shared.stream,
                                   op.amax_out);
    } else {
      cuda::cast_operand_both(static_cast<const float*>(in), codes, transposed, rows, cols, cuda::CastTo::E4M3, scale,
                              shared.stream, op.amax_out);
    }
  };
  measure(c, shared);
  check_cuda(cudaDeviceSynchronize(), "casts");
  for (void* p : {in, static_cast<void*>(codes), static_cast<void*>(transposed)}) cudaFree(p);
}

// SwiGLU's codes: forward from in [rows, 2 width] (gate | up), backward from it and the output
// gradient [rows, width], through the public entries.
void measure_swiglu(bool backward, int64_t rows, int64_t width, const Shared& shared) {
  void* in = random_device_bf16(rows * 2 * width, 2);
  void* dout = backward ? random_device_bf16(rows * width, 3) : nullptr;
  const int64_t cols = backward ? 2 * width : width;
  const int64_t bytes = loom::kernels::kept_operand_bytes(OperandCast::Fp8Tensor, rows, cols);
  void* codes = device_bytes(bytes);
  void* transposed = device_bytes(bytes);
  const double per_element = backward ? 3 * 2 + 2 * 2 * 1 : 2 * 2 + 2 * 1;  // of the [rows, width] output (gradient)
  Case c{backward ? "swiglu backward codes E5M2" : "swiglu forward codes E4M3", shape_of(rows, cols),
         static_cast<double>(rows * width) * per_element, {}};
  c.cast = [&](bool current) {
    const CastOperand op = produced_cast(shared, current, backward);
    if (backward) {
      loom::kernels::activation_backward_codes(kGpu, loom::kernels::MlpActivation::Swiglu, dout, in, rows, width, op,
                                               codes, transposed);
    } else {
      loom::kernels::activation_forward_codes(kGpu, loom::kernels::MlpActivation::Swiglu, in, rows, width, op, codes,
                                              transposed);
    }
  };
  measure(c, shared);
  check_cuda(cudaDeviceSynchronize(), "SwiGLU codes");
  for (void* p : {in, dout, codes, transposed}) cudaFree(p);
}

void run() {
  loom::kernels::cuda::start_backend();
  Shared shared;
  // The largest case's half: SwiGLU's backward codes, 10 bytes per element of [8192, 8192].
  const int64_t copy_bytes = kTokens * kHidden * 10 / 2;
  shared.copy_from = device_bytes(copy_bytes);
  shared.copy_to = device_bytes(copy_bytes);
  check_cuda(cudaMemset(shared.copy_from, 0x5a, static_cast<size_t>(copy_bytes)), "cudaMemset");
  std::printf(
      "# CAST|<tiles and recipe>|<operation>|<shape [rows x cols] of the codes>|<ms>|<GB read + written>|<TB/s>|"
      "<cudaMemcpyAsync TB/s moving the same bytes>|<TB/s / memcpy TB/s>\n");
  measure_operand("weight fp32 gate/up", kHidden, kModel, false, true, shared);
  measure_operand("weight fp32 down", kModel, kHidden, false, true, shared);
  measure_operand("weight fp32 q/o", kModel, kModel, false, true, shared);
  measure_operand("weight fp32 k/v", kKv, kModel, false, true, shared);
  measure_operand("activation bf16", kTokens, kModel, true, false, shared);
  measure_swiglu(false, kTokens, kHidden, shared);
  measure_swiglu(true, kTokens, kHidden, shared);
  for (void* p : {static_cast<void*>(shared.amax), static_cast<void*>(shared.taken), shared.copy_from,
                  shared.copy_to})
    cudaFree(p);
}

}  // namespace

int main() { return loom::bench::gpu_main("loom_bench_cast_cuda", "cast", run); }
