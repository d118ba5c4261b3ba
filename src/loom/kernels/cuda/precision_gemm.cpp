#include "loom/kernels/cuda/precision_gemm.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/gemm_lt.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

// An operand as stored, row-major [rows, cols], and whether the GEMM reduces along its columns.
struct Stored {
  int64_t rows, cols;
  bool k_in_cols;
  int64_t count() const { return rows * cols; }
  int64_t k() const { return k_in_cols ? cols : rows; }
  int64_t other() const { return k_in_cols ? rows : cols; }
};

// The product's view of one operand: what cuBLASLt reads.
struct Prepared {
  const void* data;
  GemmType type;
  bool k_in_cols;
  const float* scale = nullptr;
  ScaleMode mode = ScaleMode::None;
};

struct Dims {
  int64_t m, n, k;
};

Dims dims_of(const PrecisionGemm& g) {
  switch (g.pass) {
    case LinearGemm::Forward: return {g.n, g.out_features, g.in_features};
    case LinearGemm::DataGrad: return {g.n, g.in_features, g.out_features};
    case LinearGemm::WeightGrad: return {g.out_features, g.in_features, g.n};
  }
  return {0, 0, 0};
}

// a: in [n, IC] (forward), dout [n, OC] (dgrad, wgrad); b: W [OC, IC] (forward, dgrad), in [n, IC] (wgrad).
Stored stored_a(const PrecisionGemm& g) {
  if (g.pass == LinearGemm::Forward) return {g.n, g.in_features, true};
  return {g.n, g.out_features, g.pass == LinearGemm::DataGrad};
}
Stored stored_b(const PrecisionGemm& g) {
  if (g.pass == LinearGemm::WeightGrad) return {g.n, g.in_features, false};
  return {g.out_features, g.in_features, g.pass == LinearGemm::Forward};
}

bool is_fp8_cast(OperandCast c) {
  return c == OperandCast::Fp8Tensor || c == OperandCast::Fp8Blocks || c == OperandCast::Fp8Tiles;
}
Fp8 fp8_of(const CastOperand& op) { return op.e5m2 ? Fp8::E5M2 : Fp8::E4M3; }

void copy(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpyAsync (precision GEMM operand)");
}

// Where an operand's cast goes: the scratch, or (b under CastStore::Write) the weight's store.
struct Into {
  void* codes = nullptr;
  float* scales = nullptr;
};

Into store_of(const PrecisionGemm& g) {
  if (g.b_store_use == CastStore::None) return {};
  const WeightCastLayout l = weight_cast_layout(g.b.cast, g.out_features, g.in_features);
  auto* base = static_cast<uint8_t*>(g.b_store);
  return {base, reinterpret_cast<float*>(base + l.scale_offset)};
}

// A per-tensor FP8 operand's scale and its inverse in device memory (from its device amax under
// fp8_current, from the host's scale under fp8_delayed): nothing is read back. The pair into
// `into` (or the scratch) and, when `copy` is set, there too.
const float* tensor_scale(const CastOperand& op, Scratch& scratch, cudaStream_t stream, Into into = {},
                          float* copy = nullptr) {
  float* scale_and_inverse = into.scales != nullptr ? into.scales : scratch.floats(kFp8ScalePairFloats);
  fp8_tensor_scale_twice(op.amax, op.scale, op.margin, fp8_of(op), scale_and_inverse, copy, stream);
  return scale_and_inverse;
}

// The operand's values as the CPU's emulation multiplies them, in fp32 (a block-scaled operand
// read along its rows comes back transposed, its reduction dimension contiguous).
Prepared dequantized(const CastOperand& op, const Stored& s, Scratch& scratch, cudaStream_t stream) {
  if (op.cast == OperandCast::None) return {op.data, GemmType::F32, s.k_in_cols};
  float* x = scratch.floats(s.count());
  switch (op.cast) {
    case OperandCast::Bf16:
    case OperandCast::Fp16:
      finish_output(x, op.data, false, nullptr, 1, s.count(),
                    op.cast == OperandCast::Bf16 ? OutputRounding::Bf16 : OutputRounding::Fp16, false, stream);
      return {x, GemmType::F32, s.k_in_cols};
    case OperandCast::Fp8Tensor:
      if (op.amax_out != nullptr) amax_into(op.amax_out, op.data, s.count(), stream);
      copy(x, op.data, s.count(), stream);
      quantize_dequantize_fp8(x, s.count(), fp8_of(op), tensor_scale(op, scratch, stream), stream);
      return {x, GemmType::F32, s.k_in_cols};
    case OperandCast::Fp8Blocks:
      cast_operand(op.data, x, s.rows, s.cols, !s.k_in_cols, CastTo::F32, nullptr, stream);
      quantize_dequantize_rowwise_blocks(x, s.other(), s.k(), Fp8::E4M3, nullptr, stream);
      return {x, GemmType::F32, true};
    case OperandCast::Fp8Tiles:
      copy(x, op.data, s.count(), stream);
      quantize_dequantize_tile_blocks(x, s.rows, s.cols, Fp8::E4M3, nullptr, stream);
      return {x, GemmType::F32, s.k_in_cols};
    case OperandCast::Mxfp8:
      copy(x, op.data, s.count(), stream);
      if (s.k_in_cols) {
        quantize_dequantize_mx(x, s.rows, s.cols, Fp8::E4M3, stream);
      } else {
        quantize_dequantize_mx_columns(x, s.rows, s.cols, Fp8::E4M3, stream);
      }
      return {x, GemmType::F32, s.k_in_cols};
    case OperandCast::None: break;
  }
  return {op.data, GemmType::F32, s.k_in_cols};
}

// bf16 or fp16 copies in the stored orientation (cuBLASLt transposes 16-bit operands itself).
Prepared sixteen_bit(const float* data, const Stored& s, bool fp16, Scratch& scratch, cudaStream_t stream,
                     Into into = {}) {
  void* x = into.codes != nullptr ? into.codes : scratch.bytes(s.count() * 2);
  cast_operand(data, x, s.rows, s.cols, false, fp16 ? CastTo::F16 : CastTo::BF16, nullptr, stream);
  return {x, fp16 ? GemmType::F16 : GemmType::BF16, s.k_in_cols};
}

// FP8 codes [other, k] (the reduction dimension contiguous) and their scale inverses.
Prepared fp8(const CastOperand& op, const Stored& s, Scratch& scratch, cudaStream_t stream, Into into = {}) {
  auto* codes = static_cast<uint8_t*>(into.codes != nullptr ? into.codes : scratch.bytes(s.count()));
  if (op.cast == OperandCast::Fp8Tensor) {
    const float* scale = tensor_scale(op, scratch, stream, into);
    const Fp8 f = fp8_of(op);
    cast_operand(op.data, codes, s.rows, s.cols, !s.k_in_cols, f == Fp8::E4M3 ? CastTo::E4M3 : CastTo::E5M2, scale,
                 stream, op.amax_out);
    return {codes, f == Fp8::E4M3 ? GemmType::E4M3 : GemmType::E5M2, true, scale + kFp8InverseOffset,
            ScaleMode::Tensor};
  }
  const float* src = op.data;
  if (!s.k_in_cols) {  // blocks run along the reduction dimension: transpose first
    float* t = scratch.floats(s.count());
    cast_operand(op.data, t, s.rows, s.cols, true, CastTo::F32, nullptr, stream);
    src = t;
  }
  if (op.cast == OperandCast::Fp8Blocks) {
    float* inverses = into.scales != nullptr ? into.scales : scratch.floats((s.k() + 127) / 128 * s.other());
    encode_rowwise_blocks(src, codes, inverses, s.other(), s.k(), Fp8::E4M3, stream);
    return {codes, GemmType::E4M3, true, inverses, ScaleMode::Vec128};
  }
  float* inverses =
      into.scales != nullptr ? into.scales : scratch.floats(blockwise_tile_scale_count(s.other(), s.k()));
  encode_tile_blocks(src, codes, inverses, s.other(), s.k(), Fp8::E4M3, stream);
  return {codes, GemmType::E4M3, true, inverses, ScaleMode::Block128x128};
}

// Per-tensor FP8 codes of a tensor cast once for two GEMMs: this GEMM's codes [rows, cols]
// (reducing along the columns) into scratch or `into` (a weight's store, its scale there too),
// and from the same read the transposed codes [cols, rows] with the scale into `kept` (a_store,
// input_codes or dgrad's weight store, kept_operand_bytes long) for the GEMM that reduces along
// the rows (the weight gradient; a weight's dgrad). `data16`, when set, is the tensor in bf16
// (op.data unused).
Prepared fp8_keeping_transpose(const CastOperand& op, const Stored& s, void* kept, Scratch& scratch,
                               cudaStream_t stream, Into into = {}, const void* data16 = nullptr) {
  LOOM_CHECK(op.cast == OperandCast::Fp8Tensor && s.k_in_cols,
             "precision GEMM: only a per-tensor FP8 operand this GEMM reduces along its columns is kept transposed");
  const WeightCastLayout l = weight_cast_layout(OperandCast::Fp8Tensor, s.cols, s.rows);
  auto* base = static_cast<uint8_t*>(kept);
  // The pair beside the transposed codes and, into a weight's store, beside its plain ones.
  const float* scale =
      tensor_scale(op, scratch, stream, Into{base, reinterpret_cast<float*>(base + l.scale_offset)}, into.scales);
  auto* codes = static_cast<uint8_t*>(into.codes != nullptr ? into.codes : scratch.bytes(s.count()));
  const Fp8 f = fp8_of(op);
  const CastTo to = f == Fp8::E4M3 ? CastTo::E4M3 : CastTo::E5M2;
  if (data16 != nullptr) {
    cast_operand_both_bf16(data16, codes, base, s.rows, s.cols, to, scale, stream, op.amax_out);
  } else {
    cast_operand_both(op.data, codes, base, s.rows, s.cols, to, scale, stream, op.amax_out);
  }
  const float* inverse = (into.scales != nullptr ? into.scales : scale) + kFp8InverseOffset;
  return {codes, f == Fp8::E4M3 ? GemmType::E4M3 : GemmType::E5M2, true, inverse, ScaleMode::Tensor};
}

// Per-tensor FP8 codes of an operand as its GEMM reads them (the reduction dimension contiguous),
// their scale and its inverse after them (kept_operand_bytes' layout, the same either way round),
// written earlier: the transposed codes fp8_keeping_transpose or a producer kept for a weight
// gradient, or a's codes as its producer wrote them (PrecisionGemm::a_codes).
Prepared written_codes(const void* codes, const Stored& s, bool e5m2) {
  const WeightCastLayout l = weight_cast_layout(OperandCast::Fp8Tensor, s.rows, s.cols);
  const auto* base = static_cast<const uint8_t*>(codes);
  const auto* scales = reinterpret_cast<const float*>(base + l.scale_offset);
  return {base, e5m2 ? GemmType::E5M2 : GemmType::E4M3, true, scales + kFp8InverseOffset, ScaleMode::Tensor};
}

// b's cast as an earlier GEMM left it in its store (CastStore::Read): what fp8() or sixteen_bit()
// returned when they wrote it there.
Prepared from_store(const PrecisionGemm& g, const Stored& s) {
  const Into into = store_of(g);
  switch (g.b.cast) {
    case OperandCast::Bf16:
    case OperandCast::Mxfp8: return {into.codes, GemmType::BF16, s.k_in_cols};
    case OperandCast::Fp16: return {into.codes, GemmType::F16, s.k_in_cols};
    case OperandCast::Fp8Tensor:
      return {into.codes, g.b.e5m2 ? GemmType::E5M2 : GemmType::E4M3, true, into.scales + kFp8InverseOffset,
              ScaleMode::Tensor};
    case OperandCast::Fp8Blocks: return {into.codes, GemmType::E4M3, true, into.scales, ScaleMode::Vec128};
    case OperandCast::Fp8Tiles: return {into.codes, GemmType::E4M3, true, into.scales, ScaleMode::Block128x128};
    case OperandCast::None: break;
  }
  throw Error("precision GEMM: an operand without a cast has no store");
}

const char* cast_name(OperandCast c) {
  switch (c) {
    case OperandCast::None: return "none";
    case OperandCast::Bf16: return "bf16";
    case OperandCast::Fp16: return "fp16";
    case OperandCast::Fp8Tensor: return "fp8 per tensor";
    case OperandCast::Fp8Blocks: return "fp8 1x128 blocks";
    case OperandCast::Fp8Tiles: return "fp8 128x128 tiles";
    case OperandCast::Mxfp8: return "mxfp8";
  }
  return "?";
}

// Both operands of one kind, unless one is None (the fp32 fallback).
void check_casts(const PrecisionGemm& g) {
  const OperandCast a = g.a.cast, b = g.b.cast;
  const bool fine = a == OperandCast::None || b == OperandCast::None || (is_fp8_cast(a) && is_fp8_cast(b)) ||
                    (a == b && (a == OperandCast::Bf16 || a == OperandCast::Fp16 || a == OperandCast::Mxfp8));
  LOOM_CHECK(fine, std::string("precision GEMM: operands cast to ") + cast_name(a) + " and " + cast_name(b) +
                       " cannot be multiplied together (both 16-bit of one type, both FP8, or both MXFP8)");
  LOOM_CHECK(g.bias == nullptr || g.pass == LinearGemm::Forward, "precision GEMM: only the forward GEMM adds a bias");
  LOOM_CHECK(g.b_store_use == CastStore::None ||
                 (g.b_store != nullptr && g.pass != LinearGemm::WeightGrad && a != OperandCast::None &&
                  b != OperandCast::None),
             "precision GEMM: only a cast weight (forward, dgrad) is kept in a store");
  const bool sixteen = (a == OperandCast::Bf16 || a == OperandCast::Fp16) && a == b;
  const bool per_tensor = a == OperandCast::Fp8Tensor && b == OperandCast::Fp8Tensor;
  LOOM_CHECK(g.a_store_use == CastStore::None ||
                 (g.a_store != nullptr && (sixteen || per_tensor) &&
                  (g.a_store_use == CastStore::Write ? g.pass == LinearGemm::DataGrad : g.pass == LinearGemm::WeightGrad)),
             "precision GEMM: only a 16-bit or per-tensor FP8 output gradient is kept in a store (written by dgrad, "
             "read by wgrad)");
  LOOM_CHECK(g.b_store_transposed == nullptr ||
                 (per_tensor && g.pass == LinearGemm::Forward && g.b_store_use == CastStore::Write),
             "precision GEMM: a weight's transposed codes are written beside its own by a per-tensor FP8 forward "
             "writing its store");
  LOOM_CHECK(g.input_codes_use == CastStore::None ||
                 (g.input_codes != nullptr && per_tensor &&
                  (g.input_codes_use == CastStore::Write ? g.pass == LinearGemm::Forward
                                                         : g.pass == LinearGemm::WeightGrad)),
             "precision GEMM: an input's codes are kept under per-tensor FP8 only (written by the forward, read by "
             "wgrad)");
  LOOM_CHECK(g.a_codes == nullptr || (per_tensor && g.pass != LinearGemm::WeightGrad &&
                                      g.a_store_use != CastStore::Write && g.input_codes_use != CastStore::Write &&
                                      g.a16 == nullptr),
             "precision GEMM: a's given codes (a_codes) are a per-tensor FP8 forward's or dgrad's, which then casts "
             "nothing of a");
  for (const CastOperand* op : {&g.a, &g.b}) {
    LOOM_CHECK(op->amax_out == nullptr || (op->cast == OperandCast::Fp8Tensor && op->amax == nullptr),
               "precision GEMM: an amax is taken by the cast (amax_out) only of a per-tensor FP8 operand whose "
               "scale is given (not computed from an amax)");
  }
  const bool bf16 = a == OperandCast::Bf16 && b == OperandCast::Bf16;
  const bool fp8_input16 = per_tensor && g.pass == LinearGemm::Forward && g.input_codes_use == CastStore::Write;
  LOOM_CHECK((g.a16 == nullptr || (bf16 && g.a_store_use == CastStore::None) || fp8_input16) &&
                 (g.b16 == nullptr || (bf16 && g.pass == LinearGemm::WeightGrad)),
             "precision GEMM: bf16 operands given (a16, b16; b16 only as wgrad's input) need both casts bf16, or for "
             "a16 a per-tensor FP8 forward keeping the input's codes");
  LOOM_CHECK(g.bias16 == nullptr || (g.bias != nullptr && g.rounding == OutputRounding::Bf16),
             "precision GEMM: a bf16 bias (bias16) goes with its fp32 bias under a bf16 rounding");
  LOOM_CHECK(g.addend == nullptr || (g.accumulate && g.pass == LinearGemm::Forward && g.out16 == nullptr),
             "precision GEMM: an addend is for a forward accumulating into its fp32 output");
  LOOM_CHECK((g.pre_gelu16 == nullptr || (g.pass == LinearGemm::Forward && g.out16 != nullptr && bf16)) &&
                 (g.gelu_input16 == nullptr || (g.pass == LinearGemm::DataGrad && g.out16 != nullptr && bf16)) &&
                 (g.gelu_bias_grad == nullptr || g.gelu_input16 != nullptr),
             "precision GEMM: GELU in the epilogue is a bf16 forward's (pre_gelu16) or a bf16 dgrad's (gelu_input16, "
             "with the bias gradient gelu_bias_grad), into a bf16 output (out16)");
  LOOM_CHECK(g.out16 == nullptr || (a != OperandCast::None && b != OperandCast::None &&
                                    g.pass != LinearGemm::WeightGrad && g.rounding == OutputRounding::Bf16 &&
                                    !g.accumulate),
             "precision GEMM: a bf16 output (out16) is for a forward or dgrad of cast operands, rounded to bf16, not "
             "accumulated");
}

// The bias as the recipe adds it (PrecisionGemm::bias): rounded to the output's dtype first, in
// fp32 (for a finishing pass) or as bf16 (for cuBLASLt's bias epilogue, the same values).
const float* rounded_bias(const PrecisionGemm& g, Scratch& scratch, cudaStream_t stream) {
  if (g.bias == nullptr || g.rounding == OutputRounding::None) return g.bias;
  float* b = scratch.floats(g.out_features);
  finish_output(b, g.bias, false, nullptr, 1, g.out_features, g.rounding, false, stream);
  return b;
}
const void* bf16_bias(const PrecisionGemm& g, Scratch& scratch, cudaStream_t stream) {
  void* b = scratch.bytes(g.out_features * 2);
  cast_operand(g.bias, b, 1, g.out_features, false, CastTo::BF16, nullptr, stream);
  return b;
}

// The product of the prepared operands into g's output: bf16 (out16), added into out, or stored,
// with the bias and the rounding g asks for.
void multiply(const PrecisionGemm& g, const Dims& d, const Prepared& pa, const Prepared& pb, Scratch& scratch,
              cudaStream_t stream) {
  const bool block_scaled = pa.mode == ScaleMode::Vec128 || pa.mode == ScaleMode::Block128x128;
  // A bf16 result comes out of cuBLASLt rounded (nearest even, as the CPU rounds), with a bias added
  // by its epilogue (16-bit and per-tensor FP8 products: the bf16 bias, then one rounding, as the
  // CPU adds the rounded bias); anything else in fp32, rounded by the finishing pass after the bias.
  const bool tensor_cores = pa.type != GemmType::F32;
  const bool epilogue_bias = g.bias != nullptr && g.rounding == OutputRounding::Bf16 && tensor_cores && !block_scaled;
  const bool bf16_out = g.rounding == OutputRounding::Bf16 && tensor_cores && (g.bias == nullptr || epilogue_bias);
  // The caller's bf16 bias where cuBLASLt's epilogue can read it (16-byte aligned: a bias inside the
  // optimizer's packed bf16 copy of the parameters starts where its offset puts it), else a cast.
  const bool given_bias16 = g.bias16 != nullptr && reinterpret_cast<uintptr_t>(g.bias16) % 16 == 0;
  const void* bias16 = !epilogue_bias ? nullptr : given_bias16 ? g.bias16 : bf16_bias(g, scratch, stream);
  const float* finish_bias = epilogue_bias ? nullptr : rounded_bias(g, scratch, stream);
  const int64_t count = d.m * d.n;
  const GemmOperand a_operand{pa.data, pa.type, !pa.k_in_cols, pa.scale, pa.mode};
  const GemmOperand b_operand{pb.data, pb.type, pb.k_in_cols, pb.scale, pb.mode};
  // Fast accumulation where the product is per-tensor FP8 (a recipe's bf16 blocks and FP8 block
  // scales keep the promotion).
  const bool fp8 = pa.type == GemmType::E4M3 || pa.type == GemmType::E5M2;
  const bool fast = g.fast_accumulation && fp8 && !block_scaled;
  if (g.pre_gelu16 != nullptr || g.gelu_input16 != nullptr) {  // GELU or its derivative in the epilogue
    const bool forward = g.pre_gelu16 != nullptr;
    GemmOutput out{g.out16, GemmType::BF16, bias16};
    out.epilogue = forward ? GemmOutput::Epilogue::GeluAux : GemmOutput::Epilogue::DGelu;
    out.aux = forward ? g.pre_gelu16 : const_cast<void*>(g.gelu_input16);  // DGelu only reads it
    matmul(out, a_operand, b_operand, d.m, d.n, d.k, 1.0f, 0.0f, stream);
    if (g.gelu_bias_grad != nullptr) add_column_sums_bf16(g.gelu_bias_grad, g.out16, d.m, d.n, stream);
    return;
  }
  if (g.out16 != nullptr) {  // the result stays bf16: cuBLASLt's own, or rounded after the bias
    float* sum = bf16_out ? nullptr : scratch.floats(count);
    matmul(GemmOutput{bf16_out ? g.out16 : sum, bf16_out ? GemmType::BF16 : GemmType::F32, bias16, fast}, a_operand,
           b_operand, d.m, d.n, d.k, 1.0f, 0.0f, stream);
    if (!bf16_out) finish_output_bf16(g.out16, sum, finish_bias, d.m, d.n, stream);
    return;
  }
  // An unrounded sum with no bias is added by the product itself (out = a . b + out, one rounding:
  // the finishing pass's add without its reads and writes; Megatron's gradient-accumulation fusion
  // for wgrad). cuBLASLt documents an fp32 C for 16-bit and per-tensor FP8 products; block-scaled
  // ones keep the finishing pass, and so does an output less than 16-byte aligned (a tensor of a
  // flat gradient buffer may start anywhere; FP8 products want 16 bytes), as scratch always is.
  const bool aligned = reinterpret_cast<uintptr_t>(g.out) % 16 == 0;
  if (g.accumulate && g.rounding == OutputRounding::None && g.bias == nullptr && !block_scaled && aligned) {
    if (g.addend != nullptr && g.addend != g.out)
      check_cuda(cudaMemcpyAsync(g.out, g.addend, count * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (a product's addend)");
    matmul(GemmOutput{g.out, GemmType::F32, nullptr, fast}, a_operand, b_operand, d.m, d.n, d.k, 1.0f, 1.0f, stream);
    return;
  }
  // An output less than 16-byte aligned is written through scratch as well (FP8 products refuse it).
  void* target = bf16_out ? scratch.bytes(count * 2) : (g.accumulate || !aligned) ? scratch.floats(count) : g.out;
  matmul(GemmOutput{target, bf16_out ? GemmType::BF16 : GemmType::F32, bias16, fast}, a_operand, b_operand, d.m, d.n,
         d.k, 1.0f, 0.0f, stream);
  if (target != g.out || finish_bias != nullptr || g.rounding != OutputRounding::None)
    finish_output(g.out, target, bf16_out, finish_bias, d.m, d.n, g.rounding, g.accumulate, stream, g.addend);
}

}  // namespace

void precision_linear_gemm(const PrecisionGemm& g, cudaStream_t stream) {
  const Dims d = dims_of(g);
  LOOM_CHECK(d.m >= 0 && d.n >= 0 && d.k >= 0, "precision GEMM: negative size");
  if (d.m == 0 || d.n == 0) return;
  LOOM_CHECK(d.k > 0, "precision GEMM: an empty reduction (no tokens or no features)");
  check_casts(g);
  Scratch scratch;
  const Stored sa = stored_a(g), sb = stored_b(g);
  Prepared pa{}, pb{};
  const OperandCast kind = g.a.cast;
  if (g.a.cast == OperandCast::None || g.b.cast == OperandCast::None) {
    pa = dequantized(g.a, sa, scratch, stream);
    pb = dequantized(g.b, sb, scratch, stream);
  } else if (kind == OperandCast::Bf16 || kind == OperandCast::Fp16) {
    const bool fp16 = kind == OperandCast::Fp16;
    if (g.a16 != nullptr) {
      pa = {g.a16, GemmType::BF16, sa.k_in_cols};
    } else if (g.a_store_use == CastStore::Read) {
      pa = {g.a_store, fp16 ? GemmType::F16 : GemmType::BF16, sa.k_in_cols};
    } else {
      Into into;
      if (g.a_store_use == CastStore::Write) into.codes = g.a_store;
      pa = sixteen_bit(g.a.data, sa, fp16, scratch, stream, into);
    }
    if (g.b16 != nullptr) {
      pb = {g.b16, GemmType::BF16, sb.k_in_cols};
    } else if (g.b_store_use != CastStore::Read) {
      pb = sixteen_bit(g.b.data, sb, fp16, scratch, stream, store_of(g));
    }
  } else if (kind == OperandCast::Mxfp8) {  // emulated: exact bf16 copies of the dequantized blocks
    const Prepared qa = dequantized(g.a, sa, scratch, stream);
    pa = sixteen_bit(static_cast<const float*>(qa.data), sa, false, scratch, stream);
    if (g.b_store_use != CastStore::Read) {
      const Prepared qb = dequantized(g.b, sb, scratch, stream);
      pb = sixteen_bit(static_cast<const float*>(qb.data), sb, false, scratch, stream, store_of(g));
    }
  } else {
    void* keep_a = g.a_store_use == CastStore::Write       ? g.a_store
                   : g.input_codes_use == CastStore::Write ? g.input_codes
                                                           : nullptr;
    if (g.a_codes != nullptr) {
      pa = written_codes(g.a_codes, sa, g.a.e5m2);
    } else if (g.a_store_use == CastStore::Read) {
      pa = written_codes(g.a_store, sa, g.a.e5m2);
    } else if (keep_a != nullptr) {
      pa = fp8_keeping_transpose(g.a, sa, keep_a, scratch, stream, {}, g.a16);
    } else {
      pa = fp8(g.a, sa, scratch, stream);
    }
    if (g.input_codes_use == CastStore::Read) {
      pb = written_codes(g.input_codes, sb, g.b.e5m2);
    } else if (g.b_store_transposed != nullptr) {
      pb = fp8_keeping_transpose(g.b, sb, g.b_store_transposed, scratch, stream, store_of(g));
    } else if (g.b_store_use != CastStore::Read) {
      pb = fp8(g.b, sb, scratch, stream, store_of(g));
    }
  }
  if (g.b_store_use == CastStore::Read) pb = from_store(g, sb);
  multiply(g, d, pa, pb, scratch, stream);
}

void round_in_place(float* x, int64_t n, OutputRounding rounding, cudaStream_t stream) {
  if (rounding == OutputRounding::None) return;
  finish_output(x, x, false, nullptr, 1, n, rounding, false, stream);
}

}  // namespace loom::kernels::cuda
