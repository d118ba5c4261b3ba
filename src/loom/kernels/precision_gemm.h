#pragma once
// One GEMM of a linear layer in a precision recipe's formats on a device, as the device entry
// kernels::precision_linear_gemm (ops.h) takes it. The CPU emulates the recipes by
// quantize-dequantize in fp32 (model/linear_precision.cpp); a GPU casts the fp32 operands to the
// recipe's formats and multiplies them on its tensor cores (kernels/cuda/precision_gemm.h,
// docs/cuda.md). The model decides every cast (formats, scales, the Inf/NaN fallback); the
// device only carries them out.
//
// The layer out[n, OC] = in[n, IC] . W[OC, IC]^T has three GEMMs, each with its own reduction
// dimension, along which block scales run:
//   Forward     out = in . W^T       a = in [n, IC],   b = W [OC, IC]   reduces over IC
//   DataGrad    din = dout . W       a = dout [n, OC], b = W [OC, IC]   reduces over OC
//   WeightGrad  dW  = dout^T . in    a = dout [n, OC], b = in [n, IC]   reduces over n
#include <cstdint>

namespace loom::kernels {

enum class LinearGemm : uint8_t { Forward, DataGrad, WeightGrad };

// What an operand becomes before the product.
enum class OperandCast : uint8_t {
  None,       // fp32 as it is: an FP8 operand holding Inf/NaN, passed on unquantized
  Bf16,       // rounded to bf16 (nearest even)
  Fp16,       // rounded to fp16 (nearest even, overflow to Inf)
  Fp8Tensor,  // FP8 codes of x * scale, one scale for the tensor (fp8_delayed, fp8_current)
  Fp8Blocks,  // FP8 E4M3, a scale per 1 x 128 run along the reduction dimension (fp8_blockwise)
  Fp8Tiles,   // FP8 E4M3, a scale per 128 x 128 tile (fp8_blockwise weights)
  Mxfp8,      // MXFP8 E4M3, blocks of 32 along the reduction dimension, E8M0 scales (mxfp8)
};

// How a GEMM's fp32 result is rounded before it is stored or added: the recipe's activation dtype,
// or not at all (a partial product a tensor-parallel sum rounds later).
enum class OutputRounding : uint8_t { None, Bf16, Fp16 };

// The FP8 casts (Fp8Tensor, Fp8Blocks, Fp8Tiles) write an element that is Inf or NaN as FP8's
// NaN, so a non-finite operand makes every output it reaches NaN (a saturating cast would hide an
// overflow from the step's non-finite check); MXFP8 makes such an element's whole block NaN.
struct CastOperand {
  const float* data = nullptr;  // row-major, device memory
  OperandCast cast = OperandCast::None;
  bool e5m2 = false;   // Fp8Tensor: E5M2 codes (output gradients) instead of E4M3
  float scale = 1.0f;  // Fp8Tensor: codes = fp8(x * scale); the product multiplies by 1 / scale
  // Fp8Tensor, when set: the tensor's amax in device memory, and the scale is computed from it on
  // the device as precision::compute_scale(amax, fp8 max, margin, 1) (fp8_current), not `scale`.
  const float* amax = nullptr;
  int margin = 0;
};

// out (+)= round(a . b [+ bias]) in the shapes above. When either operand's cast is None, the
// product runs in fp32 with the other operand quantized and dequantized in fp32 (what the CPU
// computes); otherwise both operands must be of one kind (16-bit, FP8 or MXFP8).
struct PrecisionGemm {
  LinearGemm pass = LinearGemm::Forward;
  float* out = nullptr;
  bool accumulate = false;        // add into out (always for the backward GEMMs' callers' contracts)
  const float* bias = nullptr;    // Forward only: added in fp32 before the rounding
  CastOperand a, b;
  int64_t n = 0, in_features = 0, out_features = 0;
  OutputRounding rounding = OutputRounding::Bf16;
};

}  // namespace loom::kernels
