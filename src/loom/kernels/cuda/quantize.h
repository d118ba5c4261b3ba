#pragma once
// Quantisation for the precision recipes on the device, bit for bit the CPU reference of
// loom::precision (formats.h, fp8_scaling.h, mx.h), which the tests check element by element:
// - per-tensor FP8: codes = fp8(x * scale), back as fp8 * scale_inverse; quantize_dequantize in
//   place (what an FP8 GEMM operand holds, in fp32); amax with NaN and Inf passed through;
// - blockwise FP8 (fp8_blockwise): a scale fp8_max / amax per 1 x 128 run of a row (activations,
//   gradients) or per 128 x 128 tile (weights), 1 for a zero or non-finite amax;
// - MXFP8 (OCP MX v1.0): blocks of 32 along rows or down columns share an E8M0 scale
//   2^(floor(log2 amax) - emax_elem); NaN/Inf blocks become NaN.
// Formats saturate (Overflow::Saturate), as FP8 training does. All pointers are device memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {

// Which FP8 format (the order of precision::Fp8Format).
enum class Fp8 : uint8_t { E4M3, E5M2 };

// max |x| over n elements (0 for n == 0; NaN or Inf when one is there); waits for the stream.
float amax(const float* x, int64_t n, cudaStream_t stream = nullptr);
// *dst = max(*dst, max |x|) in stream order, nothing read back (*dst +0, positive or NaN: its
// sign bit clear, as atomics on its bits need).
void amax_into(float* dst, const float* x, int64_t n, cudaStream_t stream = nullptr);
// The same over a bf16 tensor x16 (2-byte elements).
void amax_into_bf16(float* dst, const void* x16, int64_t n, cudaStream_t stream = nullptr);
// A per-tensor FP8 operand's scale and its inverse, scale_and_inverse[0] and
// [kFp8InverseOffset] (device memory, precision_gemm.h's pair),
// in stream order: from the tensor's amax on the device when `amax` is set, as
// precision::compute_scale(*amax, fp8 max, margin, 1) bit for bit (1 for a zero or non-finite
// amax, FLT_MAX when it overflows); otherwise `host_scale`. The inverse is 1 / scale, rounded.
void fp8_tensor_scale(const float* amax, float host_scale, int margin, Fp8 format, float* scale_and_inverse,
                      cudaStream_t stream = nullptr);
// The same pair written to `copy` too (when not null) by the same launch: codes kept in both
// orientations carry it after each.
void fp8_tensor_scale_twice(const float* amax, float host_scale, int margin, Fp8 format, float* scale_and_inverse,
                            float* copy, cudaStream_t stream = nullptr);

void encode_fp8(const float* in, uint8_t* codes, int64_t n, Fp8 format, float scale, cudaStream_t stream = nullptr);
void decode_fp8(const uint8_t* codes, float* out, int64_t n, Fp8 format, float scale_inverse,
                cudaStream_t stream = nullptr);
void quantize_dequantize_fp8(float* data, int64_t n, Fp8 format, float scale, cudaStream_t stream = nullptr);
// The same with the scale in device memory (fp8_tensor_scale's first value).
void quantize_dequantize_fp8(float* data, int64_t n, Fp8 format, const float* scale, cudaStream_t stream = nullptr);

// Blockwise, in place; scales (optional) receives each block's scale, row-major by block.
void quantize_dequantize_rowwise_blocks(float* x, int64_t rows, int64_t cols, Fp8 format, float* scales = nullptr,
                                        cudaStream_t stream = nullptr);
void quantize_dequantize_tile_blocks(float* w, int64_t rows, int64_t cols, Fp8 format, float* scales = nullptr,
                                     cudaStream_t stream = nullptr);
// Blockwise encoding for the GEMM: codes [rows, cols] (an Inf or NaN element as FP8 NaN, so the
// product shows it) and each block's scale_inverse (1 / scale, what cuBLASLt multiplies by), one per 1 x 128 run, in the layout cuBLASLt reads for
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: [ceil(cols / 128), rows], rows contiguous.
void encode_rowwise_blocks(const float* x, uint8_t* codes, float* scale_inverses, int64_t rows, int64_t cols,
                           Fp8 format, cudaStream_t stream = nullptr);
// The same per 128 x 128 tile, in cuBLASLt's layout for CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
// [ceil(rows / 128), blockwise_tile_stride(cols)], the tiles along k padded to a multiple of 4.
void encode_tile_blocks(const float* w, uint8_t* codes, float* scale_inverses, int64_t rows, int64_t cols, Fp8 format,
                        cudaStream_t stream = nullptr);
// The tile scales' row length (tiles along k rounded up to 4) and how many floats they take.
__host__ __device__ inline int64_t blockwise_tile_stride(int64_t cols) { return ((cols + 127) / 128 + 3) / 4 * 4; }
inline int64_t blockwise_tile_scale_count(int64_t rows, int64_t cols) {
  return (rows + 127) / 128 * blockwise_tile_stride(cols);
}

// MXFP8: blocks of 32 along each row (codes [rows, cols], E8M0 scales [rows, ceil(cols / 32)]).
void encode_mx(const float* data, int64_t rows, int64_t cols, Fp8 format, uint8_t* codes, uint8_t* scales,
               cudaStream_t stream = nullptr);
void decode_mx(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8 format, float* out,
               cudaStream_t stream = nullptr);
// The same decoded to bf16 (exact: an FP8 value times a power of two), for the emulated MXFP8 GEMM.
void decode_mx_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8 format,
                    __nv_bfloat16* out, cudaStream_t stream = nullptr);
void quantize_dequantize_mx(float* data, int64_t rows, int64_t cols, Fp8 format, cudaStream_t stream = nullptr);
// Blocks of 32 down each column (a [K, N] operand reduced along its rows).
void quantize_dequantize_mx_columns(float* data, int64_t rows, int64_t cols, Fp8 format,
                                    cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
