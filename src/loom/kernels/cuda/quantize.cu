#include <algorithm>
#include <cfloat>
#include <cstring>

#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/fp8_format.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/quantize.h"

namespace loom::kernels::cuda {

namespace {

constexpr int64_t kBlockwise = 128;  // precision::kBlockwiseSize
constexpr int kMx = 32;              // precision::kMxBlockSize

__host__ __device__ inline float fp8_max(Fp8 f) { return f == Fp8::E4M3 ? 448.0f : 57344.0f; }
__device__ inline int max_normal_exponent(Fp8 f) { return f == Fp8::E4M3 ? 8 : 15; }

// precision::block_scale: fp8_max / amax, 1 for a zero or non-finite amax, FLT_MAX on overflow.
__device__ inline float block_scale(float amax, Fp8 f) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
  const float scale = __fdiv_rn(fp8_max(f), amax);
  return isinf(scale) ? FLT_MAX : scale;
}

// MX: the E8M0 bits of a block's scale (0xFF for a non-finite amax) and 2^-shared_exp.
__device__ inline uint8_t mx_scale_bits(float amax, Fp8 f) {
  if (!isfinite(amax)) return 0xff;
  const int field = static_cast<int>((__float_as_uint(fabsf(amax)) >> 23) & 0xffu);
  return static_cast<uint8_t>(max(-127, field - 127 - max_normal_exponent(f)) + 127);
}
__device__ inline float mx_inverse_scale(uint8_t bits) { return __uint_as_float(static_cast<uint32_t>(254 - bits) << 23); }
__device__ inline float e8m0_to_float(uint8_t bits) {
  if (bits == 0xff) return __uint_as_float(0x7fc00000u);
  if (bits == 0) return 0x1p-127f;
  return __uint_as_float(static_cast<uint32_t>(bits) << 23);
}

// Four loads in flight per thread and turn (a max needs no order): with the grid capped at about one
// resident wave (amax_grid), one load at a time would leave the memory system half idle.
template <typename In>
__global__ void amax_kernel(const In* __restrict__ x, int64_t n, unsigned* result) {
  float m = 0.0f;
  const int64_t stride = grid_stride();
  int64_t i = grid_start();
  for (; i + 3 * stride < n; i += 4 * stride) {
    const float a = load(x, i), b = load(x, i + stride), c = load(x, i + 2 * stride), d = load(x, i + 3 * stride);
    m = nan_max(nan_max(nan_max(nan_max(m, fabsf(a)), fabsf(b)), fabsf(c)), fabsf(d));
  }
  for (; i < n; i += stride) m = nan_max(m, fabsf(load(x, i)));
  block_amax_into(result, m);
}

// amax_kernel on 4-element packs (pack4.cuh), four packs in flight per thread: 64 bytes of fp32
// where the scalar loop holds 16, so the capped grid keeps enough bytes in flight to approach the
// card's bandwidth. x pack-aligned; the last n % 4 elements one at a time.
constexpr int kAmaxPacks = 4;
template <typename In>
__global__ void amax4_kernel(const In* __restrict__ x, int64_t n, unsigned* result) {
  float m = 0.0f;
  Pack4<In> held[kAmaxPacks];
  grid_pack_steps<kAmaxPacks>(
      n, [&](int j, int64_t p) { held[j] = pack_at(x + 4 * p); },
      [&](int j, int64_t) {
#pragma unroll
        for (int k = 0; k < 4; ++k) m = nan_max(m, fabsf(load(held[j].v, k)));
      },
      [&](int64_t i) { m = nan_max(m, fabsf(load(x, i))); });
  block_amax_into(result, m);
}

template <typename In>
void launch_amax(const In* x, int64_t n, unsigned* result, cudaStream_t stream, const char* what) {
  if (pack4_aligned<In>(x)) {
    amax4_kernel<<<amax_grid((n + 4 * kAmaxPacks - 1) / (4 * kAmaxPacks)), kThreads, 0, stream>>>(x, n, result);
  } else {
    amax_kernel<<<amax_grid(n), kThreads, 0, stream>>>(x, n, result);
  }
  check_launch(what);
}

// precision::compute_scale(amax, fp8_max, margin, 1): ldexpf is exact, as std::ldexp.
__device__ inline float tensor_scale(float amax, Fp8 f, int margin) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
  const float scale = ldexpf(__fdiv_rn(fp8_max(f), amax), -margin);
  return isinf(scale) ? FLT_MAX : scale;
}

// The pair into out and, when set, into copy too (a weight's plain codes' store beside its
// transposed one): one launch where a device-to-device copy would add another.
__global__ void tensor_scale_kernel(const float* amax, float host_scale, int margin, Fp8 f, float* out, float* copy) {
  const float scale = amax ? tensor_scale(*amax, f, margin) : host_scale;
  store_fp8_scale_pair(out, scale);
  if (copy != nullptr) store_fp8_scale_pair(copy, scale);
}

__global__ void encode_kernel(const float* __restrict__ in, uint8_t* __restrict__ codes, int64_t n, Fp8 f,
                              float scale) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) codes[i] = fp8_encode(__fmul_rn(in[i], scale), f);
}
__global__ void decode_kernel(const uint8_t* __restrict__ codes, float* __restrict__ out, int64_t n, Fp8 f,
                              float scale_inverse) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) out[i] = __fmul_rn(fp8_decode(codes[i], f), scale_inverse);
}
__global__ void round_trip_kernel(float* data, int64_t n, Fp8 f, float scale, const float* device_scale) {
  if (device_scale) scale = *device_scale;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) data[i] = fp8_round_trip(data[i], f, scale);
}

// One warp per 1 x 128 run: amax, scale, then either the round trip in place (scales as the CPU
// keeps them) or, for_gemm, the codes and scale inverses in cuBLASLt's layout.
__global__ void rowwise_kernel(float* x, const float* in, uint8_t* codes, float* scales, bool for_gemm, int64_t rows,
                               int64_t cols, Fp8 f) {
  const int64_t per_row = (cols + kBlockwise - 1) / kBlockwise;
  const int64_t run = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (run >= rows * per_row) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const int64_t r = run / per_row, c0 = (run % per_row) * kBlockwise, length = min(kBlockwise, cols - c0);
  const float* src = (in ? in : x) + r * cols + c0;
  float m = 0.0f;
  for (int64_t i = lane; i < length; i += 32) m = nan_max(m, fabsf(src[i]));
  const float scale = block_scale(warp_nan_max(m), f);
  for (int64_t i = lane; i < length; i += 32) {
    if (codes) {
      codes[r * cols + c0 + i] = fp8_gemm_code(src[i], scale, f);
    } else {
      x[r * cols + c0 + i] = fp8_round_trip(src[i], f, scale);
    }
  }
  // The GEMM's scale inverses go in cuBLASLt's layout for 1 x 128 runs: [blocks along k, rows].
  if (lane == 0 && scales) {
    if (for_gemm) {
      scales[(run % per_row) * rows + r] = __fdiv_rn(1.0f, scale);
    } else {
      scales[run] = scale;
    }
  }
}

// One block per 128 x 128 tile; for_gemm as rowwise_kernel.
__global__ void tile_kernel(float* w, const float* in, uint8_t* codes, float* scales, bool for_gemm, int64_t rows,
                            int64_t cols, Fp8 f) {
  __shared__ float warp_max_values[kThreads / 32];
  const int64_t tile_cols = (cols + kBlockwise - 1) / kBlockwise;
  const int64_t r0 = (blockIdx.x / tile_cols) * kBlockwise, c0 = (blockIdx.x % tile_cols) * kBlockwise;
  const int64_t height = min(kBlockwise, rows - r0), width = min(kBlockwise, cols - c0);
  const float* src = in ? in : w;
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < height * width; k += blockDim.x)
    m = nan_max(m, fabsf(src[(r0 + k / width) * cols + c0 + k % width]));
  m = warp_nan_max(m);
  if (threadIdx.x % 32 == 0) warp_max_values[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) m = nan_max(m, warp_max_values[i]);
  const float scale = block_scale(m, f);
  for (int64_t k = threadIdx.x; k < height * width; k += blockDim.x) {
    const int64_t at = (r0 + k / width) * cols + c0 + k % width;
    if (codes) {
      codes[at] = fp8_gemm_code(src[at], scale, f);
    } else {
      w[at] = fp8_round_trip(src[at], f, scale);
    }
  }
  // The GEMM's scale inverses go in cuBLASLt's layout for tiles: [tile rows, tile columns padded to 4].
  if (threadIdx.x == 0 && scales) {
    if (for_gemm) {
      scales[(blockIdx.x / tile_cols) * blockwise_tile_stride(cols) + blockIdx.x % tile_cols] = __fdiv_rn(1.0f, scale);
    } else {
      scales[blockIdx.x] = scale;
    }
  }
}

// One warp per block of 32 along a row (lane = element).
__global__ void mx_rows_kernel(float* data, const float* in, uint8_t* codes, uint8_t* scales, int64_t rows,
                               int64_t cols, Fp8 f) {
  const int64_t per_row = (cols + kMx - 1) / kMx;
  const int64_t block = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (block >= rows * per_row) return;
  const int lane = threadIdx.x % 32;
  const int64_t r = block / per_row, c = (block % per_row) * kMx + lane;
  const bool inside = c < cols;
  const float v = inside ? (in ? in : data)[r * cols + c] : 0.0f;
  const uint8_t bits = mx_scale_bits(warp_nan_max(fabsf(v)), f);
  if (codes) {
    const uint8_t nan_code = f == Fp8::E4M3 ? 0x7f : 0x7e;
    if (inside) codes[r * cols + c] = bits == 0xff ? nan_code : fp8_encode(__fmul_rn(v, mx_inverse_scale(bits)), f);
    if (lane == 0) scales[block] = bits;
  } else if (inside) {
    data[r * cols + c] = bits == 0xff ? __uint_as_float(0x7fc00000u) : fp8_round_trip(v, f, mx_inverse_scale(bits));
  }
}

__device__ inline void put(float* p, float v) { *p = v; }
__device__ inline void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void mx_decode_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8 f,
                                 T* out) {
  const int64_t per_row = (cols + kMx - 1) / kMx;
  for (int64_t k = grid_start(); k < rows * cols; k += grid_stride()) {
    const int64_t r = k / cols, c = k % cols;
    put(out + k, __fmul_rn(fp8_decode(codes[k], f), e8m0_to_float(scales[r * per_row + c / kMx])));
  }
}

// One thread per (column, 32-row panel): adjacent threads read adjacent columns.
__global__ void mx_columns_kernel(float* data, int64_t rows, int64_t cols, Fp8 f) {
  const int64_t panels = (rows + kMx - 1) / kMx;
  for (int64_t k = grid_start(); k < panels * cols; k += grid_stride()) {
    const int64_t c = k % cols, r0 = (k / cols) * kMx, r1 = min(rows, r0 + kMx);
    float m = 0.0f;
    for (int64_t r = r0; r < r1; ++r) m = nan_max(m, fabsf(data[r * cols + c]));
    const uint8_t bits = mx_scale_bits(m, f);
    for (int64_t r = r0; r < r1; ++r) {
      float& v = data[r * cols + c];
      v = bits == 0xff ? __uint_as_float(0x7fc00000u) : fp8_round_trip(v, f, mx_inverse_scale(bits));
    }
  }
}

unsigned warps_grid(int64_t warps) { return static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads); }

}  // namespace

void amax_into(float* dst, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_amax(x, n, reinterpret_cast<unsigned*>(dst), stream, "amax_kernel");
}

void amax_into_bf16(float* dst, const void* x16, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_amax(static_cast<const __nv_bfloat16*>(x16), n, reinterpret_cast<unsigned*>(dst), stream,
              "amax_kernel (bf16)");
}

void fp8_tensor_scale(const float* amax, float host_scale, int margin, Fp8 format, float* scale_and_inverse,
                      cudaStream_t stream) {
  fp8_tensor_scale_twice(amax, host_scale, margin, format, scale_and_inverse, nullptr, stream);
}

void fp8_tensor_scale_twice(const float* amax, float host_scale, int margin, Fp8 format, float* scale_and_inverse,
                            float* copy, cudaStream_t stream) {
  tensor_scale_kernel<<<1, 1, 0, stream>>>(amax, host_scale, margin, format, scale_and_inverse, copy);
  check_launch("tensor_scale_kernel");
}

float amax(const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return 0.0f;
  const unsigned bits =
      read_back_word(stream, "amax", [&](unsigned* result) { launch_amax(x, n, result, stream, "amax_kernel"); });
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

void encode_fp8(const float* in, uint8_t* codes, int64_t n, Fp8 format, float scale, cudaStream_t stream) {
  if (n == 0) return;
  encode_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, codes, n, format, scale);
  check_launch("encode_kernel");
}
void decode_fp8(const uint8_t* codes, float* out, int64_t n, Fp8 format, float scale_inverse, cudaStream_t stream) {
  if (n == 0) return;
  decode_kernel<<<grid_for(n), kThreads, 0, stream>>>(codes, out, n, format, scale_inverse);
  check_launch("decode_kernel");
}
void quantize_dequantize_fp8(float* data, int64_t n, Fp8 format, float scale, cudaStream_t stream) {
  if (n == 0) return;
  round_trip_kernel<<<grid_for(n), kThreads, 0, stream>>>(data, n, format, scale, nullptr);
  check_launch("round_trip_kernel");
}
void quantize_dequantize_fp8(float* data, int64_t n, Fp8 format, const float* scale, cudaStream_t stream) {
  if (n == 0) return;
  round_trip_kernel<<<grid_for(n), kThreads, 0, stream>>>(data, n, format, 1.0f, scale);
  check_launch("round_trip_kernel");
}

void quantize_dequantize_rowwise_blocks(float* x, int64_t rows, int64_t cols, Fp8 format, float* scales,
                                        cudaStream_t stream) {
  const int64_t runs = rows * ((cols + kBlockwise - 1) / kBlockwise);
  if (runs == 0) return;
  rowwise_kernel<<<warps_grid(runs), kThreads, 0, stream>>>(x, nullptr, nullptr, scales, false, rows, cols, format);
  check_launch("rowwise_kernel");
}
void encode_rowwise_blocks(const float* x, uint8_t* codes, float* scale_inverses, int64_t rows, int64_t cols,
                           Fp8 format, cudaStream_t stream) {
  const int64_t runs = rows * ((cols + kBlockwise - 1) / kBlockwise);
  if (runs == 0) return;
  rowwise_kernel<<<warps_grid(runs), kThreads, 0, stream>>>(nullptr, x, codes, scale_inverses, true, rows, cols,
                                                             format);
  check_launch("rowwise_kernel");
}
void quantize_dequantize_tile_blocks(float* w, int64_t rows, int64_t cols, Fp8 format, float* scales,
                                     cudaStream_t stream) {
  const int64_t tiles = ((rows + kBlockwise - 1) / kBlockwise) * ((cols + kBlockwise - 1) / kBlockwise);
  if (tiles == 0) return;
  tile_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(w, nullptr, nullptr, scales, false, rows, cols,
                                                                     format);
  check_launch("tile_kernel");
}
void encode_tile_blocks(const float* w, uint8_t* codes, float* scale_inverses, int64_t rows, int64_t cols, Fp8 format,
                        cudaStream_t stream) {
  const int64_t tiles = ((rows + kBlockwise - 1) / kBlockwise) * ((cols + kBlockwise - 1) / kBlockwise);
  if (tiles == 0) return;
  // Rows of scales padded to a multiple of 4 (cuBLASLt's layout): the padding zeroed, never stale.
  const int64_t with_padding = blockwise_tile_scale_count(rows, cols);
  if (with_padding != tiles) {
    check_cuda(cudaMemsetAsync(scale_inverses, 0, static_cast<size_t>(with_padding) * sizeof(float), stream),
               "cudaMemsetAsync (tile scale padding)");
  }
  tile_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(nullptr, w, codes, scale_inverses, true, rows,
                                                                     cols, format);
  check_launch("tile_kernel");
}

void encode_mx(const float* data, int64_t rows, int64_t cols, Fp8 format, uint8_t* codes, uint8_t* scales,
               cudaStream_t stream) {
  const int64_t blocks = rows * ((cols + kMx - 1) / kMx);
  if (blocks == 0) return;
  mx_rows_kernel<<<warps_grid(blocks), kThreads, 0, stream>>>(nullptr, data, codes, scales, rows, cols, format);
  check_launch("mx_rows_kernel");
}
void decode_mx(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8 format, float* out,
               cudaStream_t stream) {
  if (rows * cols == 0) return;
  mx_decode_kernel<float><<<grid_for(rows * cols), kThreads, 0, stream>>>(codes, scales, rows, cols, format, out);
  check_launch("mx_decode_kernel");
}
void decode_mx_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8 format,
                    __nv_bfloat16* out, cudaStream_t stream) {
  if (rows * cols == 0) return;
  mx_decode_kernel<__nv_bfloat16><<<grid_for(rows * cols), kThreads, 0, stream>>>(codes, scales, rows, cols, format,
                                                                                  out);
  check_launch("mx_decode_kernel");
}
void quantize_dequantize_mx(float* data, int64_t rows, int64_t cols, Fp8 format, cudaStream_t stream) {
  const int64_t blocks = rows * ((cols + kMx - 1) / kMx);
  if (blocks == 0) return;
  mx_rows_kernel<<<warps_grid(blocks), kThreads, 0, stream>>>(data, nullptr, nullptr, nullptr, rows, cols, format);
  check_launch("mx_rows_kernel");
}
void quantize_dequantize_mx_columns(float* data, int64_t rows, int64_t cols, Fp8 format, cudaStream_t stream) {
  const int64_t work = ((rows + kMx - 1) / kMx) * cols;
  if (work == 0) return;
  mx_columns_kernel<<<grid_for(work), kThreads, 0, stream>>>(data, rows, cols, format);
  check_launch("mx_columns_kernel");
}

}  // namespace loom::kernels::cuda
