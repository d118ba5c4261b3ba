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
#include <algorithm>
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
  // Fp8Tensor with its scale given (`scale`, fp8_delayed's from the history), when set: the cast
  // also takes the tensor's amax from the read that casts it, max |x| into this device float
  // (kernels::amax_into's contract: NaN wins, then Inf), so no amax pass reads it first. Only a
  // GEMM that casts the operand takes it (one reading a store or given codes does not).
  float* amax_out = nullptr;
};

// A weight's cast kept between GEMMs (model/weight_cast_cache.h): device memory its owner holds,
// weight_cast_bytes() long. Write: the GEMM casts b into it (where it would cast into scratch) and
// multiplies that; Read: an earlier GEMM of the same weight and form wrote it, so the GEMM
// multiplies it without casting (b.data, b.scale and b.amax are not read). Forward and DataGrad
// only (b is the weight); never with a None cast.
enum class CastStore : uint8_t { None, Write, Read };

// Which of a weight's casts a GEMM multiplies: the 16-bit copies serve forward and dgrad alike
// (cuBLASLt transposes them itself); FP8 codes are transposed for dgrad, and block scales run
// along each GEMM's reduction dimension, so those recipes keep a second form for dgrad.
inline int weight_cast_form(OperandCast cast, LinearGemm pass) {
  if (cast == OperandCast::Bf16 || cast == OperandCast::Fp16) return 0;
  return pass == LinearGemm::Forward ? 0 : 1;
}

// A per-tensor FP8 operand's scale and its inverse in device memory: the scale first (the casts
// read it), the inverse kFp8InverseOffset floats (16 bytes) after it, where cuBLASLt reads it: its
// FP8 products refuse a scale pointer that is not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED from
// the product itself, after the heuristic accepted the plan). The pair starts 16-byte aligned.
constexpr int64_t kFp8InverseOffset = 4;
constexpr int64_t kFp8ScalePairFloats = kFp8InverseOffset + 1;

// The layout of a weight's cast in its store, for W [out_features, in_features]: the codes (FP8:
// 1 byte per element; 16-bit and MXFP8's decoded bf16: 2) first, then the scales (a per-tensor
// scale and its inverse, or the block / tile scale inverses in cuBLASLt's layout), 256-byte aligned.
struct WeightCastLayout {
  int64_t code_bytes = 0, scale_offset = 0, bytes = 0;
};
inline WeightCastLayout weight_cast_layout(OperandCast cast, int64_t out_features, int64_t in_features) {
  const auto align = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t count = out_features * in_features;
  const auto tiles = [](int64_t rows, int64_t cols) { return (rows + 127) / 128 * (((cols + 127) / 128 + 3) / 4 * 4); };
  int64_t element = 1, scales = 0;
  switch (cast) {
    case OperandCast::None: return {};
    case OperandCast::Bf16:
    case OperandCast::Fp16:
    case OperandCast::Mxfp8: element = 2; break;
    case OperandCast::Fp8Tensor: scales = kFp8ScalePairFloats; break;
    case OperandCast::Fp8Blocks:  // either orientation
      scales = std::max((in_features + 127) / 128 * out_features, (out_features + 127) / 128 * in_features);
      break;
    case OperandCast::Fp8Tiles:  // W or W^T
      scales = std::max(tiles(out_features, in_features), tiles(in_features, out_features));
      break;
  }
  WeightCastLayout l;
  l.code_bytes = count * element;
  l.scale_offset = align(l.code_bytes);
  l.bytes = l.scale_offset + align(scales * 4);
  return l;
}

// The bytes of an activation operand [rows, cols]'s cast kept for a later GEMM (PrecisionGemm's
// a_store, input_codes): a 16-bit copy in its own layout, or per-tensor FP8's codes transposed to
// [cols, rows] (the weight gradient reduces over rows) followed by their scale and its inverse,
// laid out as a weight's cast (weight_cast_layout). 0 for the other casts, which are not kept.
inline int64_t kept_operand_bytes(OperandCast cast, int64_t rows, int64_t cols) {
  if (cast == OperandCast::Bf16 || cast == OperandCast::Fp16) return rows * cols * 2;
  if (cast == OperandCast::Fp8Tensor) return weight_cast_layout(cast, cols, rows).bytes;
  return 0;
}

// out (+)= round(a . b [+ bias]) in the shapes above. When either operand's cast is None, the
// product runs in fp32 with the other operand quantized and dequantized in fp32 (what the CPU
// computes); otherwise both operands must be of one kind (16-bit, FP8 or MXFP8).
struct PrecisionGemm {
  LinearGemm pass = LinearGemm::Forward;
  float* out = nullptr;
  bool accumulate = false;        // add into out (always for the backward GEMMs' callers' contracts)
  // A forward accumulating into a new tensor: out = addend + result, the add reading addend (fp32,
  // out's shape; may equal out) instead of out, so a residual stream's next tensor is written from
  // its input in the same pass rather than copied from it first (model::Block). Null: out itself.
  const float* addend = nullptr;
  // Forward only: rounded to the output's dtype (`rounding`; as it is under None), then added to the
  // fp32 product before that is rounded: a 16-bit model's bias, as Megatron, Transformer Engine and
  // llm.c add it (on a GPU by cuBLASLt's bias epilogue where it serves, kernels/cuda/gemm_lt.h).
  const float* bias = nullptr;
  // The bias already rounded to bf16 where the caller has it (the optimizer's bf16 copy of the
  // parameters: model/weight_cast_cache.h), for a bf16 rounding: cuBLASLt's epilogue reads it
  // instead of a per-call cast of `bias` (which must still be given: the same values). Any
  // alignment: one that is not 16-byte aligned (the epilogue's need) is cast from `bias` instead.
  const void* bias16 = nullptr;
  CastOperand a, b;
  // A per-tensor FP8 product without the periodic promotion of its partial sums to fp32 (cuBLASLt's
  // fast accumulation, kernels/cuda/gemm_lt.h; Transformer Engine's default for forward GEMMs).
  // Only a GPU's tensor cores have the narrower accumulator: elsewhere the sums are fp32 throughout.
  bool fast_accumulation = false;
  int64_t n = 0, in_features = 0, out_features = 0;
  OutputRounding rounding = OutputRounding::Bf16;
  // b's cast kept in a store (Forward and DataGrad: b is the weight); see CastStore.
  void* b_store = nullptr;
  CastStore b_store_use = CastStore::None;
  // Per-tensor FP8, a Forward writing its weight's store: DataGrad's store of the same weight
  // (weight_cast_layout bytes), into which the same pass over the weight writes its transposed
  // codes and scale, so dgrad reads them (CastStore::Read) instead of casting the weight again.
  void* b_store_transposed = nullptr;
  // a's cast (the output gradient) kept from a layer's DataGrad (Write) for its WeightGrad (Read),
  // so it is cast once for both: a 16-bit copy (the same bytes serve both GEMMs: cuBLASLt
  // transposes 16-bit operands itself), or per-tensor FP8's transposed codes and their scale,
  // written by the same pass over dout as dgrad's codes (or by dout's producer with its a_codes:
  // then dgrad writes nothing here). Device memory of kept_operand_bytes(a.cast, n, out_features);
  // a Read multiplies it without casting (a.data, a.scale and a.amax are not read).
  void* a_store = nullptr;
  CastStore a_store_use = CastStore::None;
  // Per-tensor FP8 (Fp8Tensor): the layer's input cast once for its forward and its wgrad. The
  // Forward writes the input's transposed codes and their scale here (Write), from the same pass
  // over the input as the forward's own codes; the WeightGrad multiplies them as b (Read) instead
  // of casting the input again (b.data, b.scale and b.amax are not read); or the input's producer
  // wrote them with its a_codes (the Forward then writes nothing here). Device memory of
  // kept_operand_bytes(Fp8Tensor, n, in_features), which the caller keeps from the forward to
  // its backward (an activation saved beside the input).
  void* input_codes = nullptr;
  CastStore input_codes_use = CastStore::None;
  // Per-tensor FP8, a Forward or DataGrad: a's codes [n, K] as they lie (the reduction dimension
  // contiguous) followed by their scale and its inverse (kept_operand_bytes(Fp8Tensor, n, K)),
  // written by the kernel that produced a (kernels::activation_forward_codes / _backward_codes,
  // which also wrote the transposed codes the weight gradient reads as input_codes / a_store):
  // multiplied as they are (a.data, a.scale and a.amax are not read; a.e5m2 says the format).
  const void* a_codes = nullptr;
  // bf16 tensors handed over as they are, where a GPU keeps them bf16 under the bf16 recipe (a
  // head's logits: Transformer::bf16_logits; the MLP's interior: Mlp::bf16_interior). a16 / b16,
  // when set, are a's / b's bf16 copies made by the caller (b16: wgrad's input only), multiplied
  // as they are (a.data / b.data are not read; both casts must be Bf16); or, under per-tensor FP8,
  // a16 is a forward's input kept bf16 (Attention::bf16_tensors), cast to FP8 from it with its
  // codes kept (input_codes Write; a.amax, when set, is its amax). out16, when set,
  // receives the result rounded to bf16 (after the bias) instead of out: forward or dgrad of any
  // cast operands (an FP8 block's MLP hidden: Mlp::bf16_hidden), never accumulating. 2-byte
  // elements, device memory, in the layouts above.
  const void* a16 = nullptr;
  const void* b16 = nullptr;
  void* out16 = nullptr;
  // GELU in the product's epilogue, under the bf16 recipe with out16 (a GELU MLP's bf16 interior:
  // Mlp::fuses_gelu; cuBLASLt's GELU_AUX_BIAS and DGELU epilogues on a GPU, as llm.c's gelu_fusion).
  // Forward, when set: the result (after the bias, rounded to bf16) is written here, the GELU
  // input the backward needs, and out16 receives GELU of it. DataGrad, when gelu_input16 is set (a
  // GELU input such a forward kept: the up projection's, in the down projection's dgrad): out16
  // receives the result times GELU's derivative at those values, the GELU input's gradient, and
  // that gradient's column sums are added into gelu_bias_grad when set (fp32: the bias gradient of
  // the GELU input's producer). loom's GELU is the tanh form (activation.h); cuBLASLt's epilogue is
  // held to it within bf16's rounding (CudaGemm.GeluEpiloguesAreTheActivationPassesWithinBf16). The
  // emulated device computes what the unfused passes do (the activation from the rounded input, its gradient from the
  // rounded product, the sums over the unrounded gradient); a GPU's epilogue applies them to the
  // fp32 accumulator before its one rounding, and sums the bf16 gradient: within bf16's rounding.
  // (The CPU has no such entry: its GEMMs take no bf16 tensors.)
  void* pre_gelu16 = nullptr;
  const void* gelu_input16 = nullptr;
  float* gelu_bias_grad = nullptr;
};

// Whether g only multiplies bf16 tensors it is handed into its output, with nothing else done: a
// from a16; b from the weight's ready store (forward, dgrad) or from b16 (wgrad); no bias, addend,
// GELU epilogue, FP8 codes or store written; a forward's or dgrad's output bf16 (out16) or fp32
// rounded to bf16, written whole; a wgrad's fp32, unrounded, written or added into. Several such
// GEMMs given to one precision_linear_gemms call (ops.h: an MoE layer's experts) may run as one
// grouped product on a GPU (kernels/cuda/grouped_gemm.h); any other GEMM runs alone there.
inline bool groupable(const PrecisionGemm& g) {
  const bool bf16 = g.a.cast == OperandCast::Bf16 && g.b.cast == OperandCast::Bf16 && g.a16 != nullptr;
  const bool wgrad = g.pass == LinearGemm::WeightGrad;
  const bool b_given = wgrad ? g.b16 != nullptr : g.b16 == nullptr && g.b_store_use == CastStore::Read;
  const bool nothing_else = g.bias == nullptr && g.addend == nullptr && g.pre_gelu16 == nullptr &&
                            g.gelu_input16 == nullptr && g.gelu_bias_grad == nullptr && g.a_codes == nullptr &&
                            g.a_store_use == CastStore::None && g.input_codes_use == CastStore::None &&
                            g.b_store_transposed == nullptr;
  const bool output = wgrad ? g.out16 == nullptr && g.out != nullptr && g.rounding == OutputRounding::None
                            : (g.out16 != nullptr || g.out != nullptr) && g.rounding == OutputRounding::Bf16 &&
                                  !g.accumulate;
  return bf16 && b_given && nothing_else && output;
}

}  // namespace loom::kernels
