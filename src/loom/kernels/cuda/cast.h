#pragma once
// Element casts of the precision recipes' linear GEMMs (precision_gemm.h): an fp32 operand to the
// GEMM's input type, optionally transposed on the way (cuBLASLt's FP8 products need the reduction
// dimension contiguous in both operands), and a GEMM's result rounded to the recipe's dtype and
// stored or added into the fp32 output. Rounding is to nearest even as loom::precision's
// round_to_bf16 / round_to_fp16 (fp16 overflows to Inf) and fp8_encode (saturating). All pointers
// are device memory.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/precision_gemm.h"
#include "loom/kernels/cuda/quantize.h"

namespace loom::kernels::cuda {

enum class CastTo : uint8_t { F32, BF16, F16, E4M3, E5M2 };

// out = cast(in * scale) for in [rows, cols]; out [rows, cols], or [cols, rows] when transposed.
// scale (device memory, one float: fp8_tensor_scale's) multiplies before FP8 encoding only, which
// writes an Inf or NaN element as FP8 NaN; the other casts take none (null). amax, when set: a
// device float into which the same read takes max |in| (kernels::amax_into's contract), for an
// FP8 cast whose scale was known before it (fp8_delayed): no amax pass first.
void cast_operand(const float* in, void* out, int64_t rows, int64_t cols, bool transpose, CastTo to,
                  const float* scale = nullptr, cudaStream_t stream = nullptr, float* amax = nullptr);

// cast_operand's cast of in [rows, cols] twice from one read of it: out [rows, cols] as it lies
// and out_transposed [cols, rows]. An activation cast once for two GEMMs reducing along different
// dimensions (precision_gemm.h's a_store and input_codes: FP8 codes for this GEMM and, transposed,
// for the weight gradient).
void cast_operand_both(const float* in, void* out, void* out_transposed, int64_t rows, int64_t cols, CastTo to,
                       const float* scale, cudaStream_t stream = nullptr, float* amax = nullptr);
// The same from a bf16 tensor in16 (2-byte elements), widened exactly: the codes of its values as
// an fp32 tensor holding them would give (an activation kept bf16: Attention::bf16_tensors).
void cast_operand_both_bf16(const void* in16, void* out, void* out_transposed, int64_t rows, int64_t cols, CastTo to,
                            const float* scale, cudaStream_t stream = nullptr, float* amax = nullptr);

// The rows of the packed transposed cast's tiles for 1-byte codes (tiled_cast.cuh): 64, or 128
// (each transposed store of a warp 128 contiguous bytes, not 32). tiled_cast_rows() is what the
// casts use: set_tiled_cast_rows's value when one was set, else LOOM_TILED_CAST_ROWS (64 or 128;
// unset or empty: 64), read once (another value: loom::Error naming it). set_tiled_cast_rows(64 or
// 128) sets it for the process (a benchmark or test comparing both); 0 returns to the default.
int tiled_cast_rows();
void set_tiled_cast_rows(int rows);

// dst[r, c] (+)= round(src[r, c] + bias[c]) over [rows, cols]; src fp32 or (src_bf16) already
// rounded bf16; bias may be null. src may equal dst. `addend` (accumulate only): dst = addend +
// round(...), the add reading addend instead of dst (a residual stream's input, so the stream's
// next tensor needs no copy of it first); it may equal dst.
void finish_output(float* dst, const void* src, bool src_bf16, const float* bias, int64_t rows, int64_t cols,
                   OutputRounding rounding, bool accumulate, cudaStream_t stream = nullptr,
                   const float* addend = nullptr);
// dst16[r, c] = bf16(src[r, c] + bias[c]) (2-byte elements; one rounding, as finish_output's bf16).
void finish_output_bf16(void* dst16, const float* src, const float* bias, int64_t rows, int64_t cols,
                        cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
