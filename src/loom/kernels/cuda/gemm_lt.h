#pragma once
// Matrix products through cuBLASLt, in loom's row-major terms:
//   c[m, n] = alpha * op(a) . op(b) + beta * c     (op = transpose when the operand says so;
//                                                  a stored [k, m] when transposed, b [n, k])
// - F32: fp32 operands, fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32), what kernels::gemm and
//   the linear entries use on the GPU;
// - BF16 / F16: bf16 or fp16 operands, fp32 accumulation, an output of their type or fp32;
// - FP8 (E4M3 / E5M2 operands, not both E5M2): fp32 accumulation, bf16 or fp32 output, each
//   operand with a dequantisation scale in device memory: one fp32 per tensor (Tensor), one per
//   1 x 128 run along k (Vec128: [ceil(k / 128), rows], rows contiguous) or one per 128 x 128
//   tile (Block128x128: [ceil(rows / 128), ceil(k / 128) rounded up to 4]), the blockwise modes
//   cuBLASLt offers on Hopper, in its layouts (what encode_rowwise_blocks / encode_tile_blocks
//   write). cuBLASLt's FP8 rules hold: only c = a . b^T (a [m, k], b [n, k], both with k
//   contiguous), m, n, k multiples of 16.
// Each device has one cuBLASLt handle, a 32 MiB workspace from a caching allocator, and a plan
// cache keyed by shape, types, transposes, scale modes, fast accumulation, epilogue (with its aux
// output's alignment) and pointer alignment; calls are serialised per device. Every cuBLASLt status is checked; a shape no algorithm serves is a
// loom::Error naming it.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

enum class GemmType : uint8_t { F32, BF16, F16, E4M3, E5M2 };
enum class ScaleMode : uint8_t { None, Tensor, Vec128, Block128x128 };

struct GemmOperand {
  const void* data;
  GemmType type = GemmType::F32;
  bool transposed = false;
  const float* scale = nullptr;  // FP8 only: device memory, multiplied in (1 / quantisation scale)
  ScaleMode scale_mode = ScaleMode::None;
};

struct GemmOutput {
  void* data;
  GemmType type = GemmType::F32;
  // A bf16 vector [n] added to every row of the product before it is rounded to a bf16 output
  // (cuBLASLt's bias epilogue: one rounding of the fp32 sum plus the bias); device memory, 16-byte
  // aligned. 16-bit and per-tensor FP8 operands only.
  const void* bias = nullptr;
  // Per-tensor FP8 only: cuBLASLt's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): the
  // tensor cores' running sums are not promoted to full fp32 registers every few k-steps, which is
  // faster and keeps fewer bits of the sum (about 14 on Hopper; DeepSeek-V3's report). Transformer
  // Engine's choice for forward products, whose error is far below the operands' FP8 rounding;
  // gradients' products keep the promotion.
  bool fast_accumulation = false;
  // GELU in the epilogue, into a bf16 output (16-bit operands): GeluAux writes the product (after
  // the bias) to `aux` and its GELU to `data` (cuBLASLt's GELU_AUX / GELU_AUX_BIAS); DGelu writes
  // the product times GELU's derivative at `aux`'s values (DGELU). `aux` is [m, n] bf16 like the
  // output, n a multiple of 8 (cuBLASLt's leading-dimension rule), 16-byte aligned, overlapping
  // neither operand (GeluAux writes it, also from each candidate LOOM_GEMM_AUTOTUNE times; DGelu
  // only reads it).
  enum class Epilogue : uint8_t { None, GeluAux, DGelu };
  Epilogue epilogue = Epilogue::None;
  void* aux = nullptr;
};

void matmul(const GemmOutput& c, const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k,
            float alpha, float beta, cudaStream_t stream = nullptr);

// The fp32 entries of kernels/ops.h on the GPU (same contracts as kernels::cpu's linear.h).
void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
          bool accumulate, cudaStream_t stream = nullptr);
void linear_forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features, bool accumulate, cudaStream_t stream = nullptr);
void linear_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features, bool accumulate_din,
                     bool accumulate_dweight, cudaStream_t stream = nullptr);

// MXFP8 on Hopper, which has no MX tensor cores: both operands (codes and E8M0 scales as
// quantize.h's encode_mx makes them, blocks of 32 along k) are decoded to bf16 (exact: an FP8
// value times a power of two) and multiplied by the bf16 GEMM. c = a . b^T, a [m, k], b [n, k].
// `stream`: the calling thread's compute stream or the legacy one (the copies are scratch.h's).
void mxfp8_matmul_emulated(const GemmOutput& c, const uint8_t* a_codes, const uint8_t* a_scales,
                           const uint8_t* b_codes, const uint8_t* b_scales, bool e5m2, int64_t m, int64_t n,
                           int64_t k, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
