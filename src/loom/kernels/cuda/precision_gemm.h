#pragma once
// The precision recipes' linear GEMMs on the GPU (kernels/precision_gemm.h describes one): each
// fp32 operand is cast to the recipe's format in scratch memory and the product runs through
// cuBLASLt with fp32 accumulation (gemm_lt.h), then the result is rounded to the recipe's dtype
// and stored or added into the fp32 output.
//   bf16 / fp16      operands cast (nearest even), bf16 / fp16 product; bf16 results come out of
//                    cuBLASLt in bf16, fp16 ones in fp32 and are rounded after (overflow to Inf)
//   Fp8Tensor        codes of x * scale (E4M3, or E5M2 for output gradients), the scale inverse
//                    in device memory for cuBLASLt
//   Fp8Blocks/Tiles  1 x 128 runs along the reduction dimension / 128 x 128 tiles, cuBLASLt's
//                    VEC128 / BLK128x128 scale modes
//   Mxfp8            Hopper has no MX tensor cores: blocks of 32 quantized and dequantized in
//                    fp32 (bit for bit loom::precision), widened exactly to bf16, bf16 product
//   a None operand   (Inf/NaN, passed on unquantized) an fp32 product, the other operand
//                    quantized and dequantized in fp32 as on the CPU
// cuBLASLt's FP8 products want the reduction dimension contiguous in both operands, so the
// operands a GEMM reads along their rows (dgrad's W, wgrad's dout and in) are transposed while
// they are cast. A weight (b of forward and dgrad) may be cast into its store instead and read
// from it by later GEMMs without a cast (PrecisionGemm::b_store, CastStore): the same bytes either
// way. Scratch comes from a caching allocator per device and goes back to it when the
// call returns; everything runs on `stream`, in order, so the next call may reuse it at once.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {

void precision_linear_gemm(const PrecisionGemm& gemm, cudaStream_t stream = nullptr);
void round_in_place(float* x, int64_t n, OutputRounding rounding, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
