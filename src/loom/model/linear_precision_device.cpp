// LinearPrecision on a GPU: the recipe's GEMMs in its real formats through the device entry
// kernels::precision_linear_gemm (kernels/precision_gemm.h), with the CPU emulation's scales and
// amax bookkeeping (linear_precision.cpp), kept on the device: no GEMM reads anything back.
#include <algorithm>
#include <cmath>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/model/gemm_group.h"
#include "loom/model/linear_precision.h"
#include "loom/model/tensor_parallel.h"
#include "loom/precision/formats.h"
#include "loom/precision/fp8_scaling.h"

namespace loom::model {

namespace p = loom::precision;
using kernels::CastOperand;
using kernels::OperandCast;

CastOperand device_cast(Recipe recipe, Operand op, float delayed_scale, int margin) {
  CastOperand c;
  switch (recipe) {
    case Recipe::Fp32: return c;
    case Recipe::Bf16: c.cast = OperandCast::Bf16; return c;
    case Recipe::Fp16: c.cast = OperandCast::Fp16; return c;
    case Recipe::Fp8Delayed:
    case Recipe::Fp8Current:
      // TE's HYBRID formats: E5M2 for output gradients, E4M3 for inputs and weights.
      c.cast = OperandCast::Fp8Tensor;
      c.e5m2 = op == Operand::OutputGrad;
      c.scale = recipe == Recipe::Fp8Delayed ? delayed_scale : 1.0f;
      c.margin = margin;  // fp8_current: with the device amax the caller sets
      return c;
    case Recipe::Fp8Blockwise:
      c.cast = op == Operand::Weight ? OperandCast::Fp8Tiles : OperandCast::Fp8Blocks;
      return c;
    case Recipe::Mxfp8: c.cast = OperandCast::Mxfp8; return c;
    default: return c;
  }
}

int64_t device_gemm_multiple(Recipe recipe) {
  if (recipe == Recipe::Fp8Delayed || recipe == Recipe::Fp8Current) return 16;
  if (recipe == Recipe::Fp8Blockwise) return 128;
  return 1;
}

void check_device_shape(Recipe recipe, int64_t n, int64_t in_features, int64_t out_features,
                        const std::string& name) {
  const int64_t multiple = device_gemm_multiple(recipe);
  if (multiple == 1) return;
  const std::string why = multiple == 16
                              ? "cuBLASLt's FP8 products need every GEMM dimension a multiple of 16"
                              : "its 1x128 / 128x128 block scales are taken whole by cuBLASLt, so every GEMM "
                                "dimension must be a multiple of 128";
  if (n % multiple == 0 && in_features % multiple == 0 && out_features % multiple == 0) return;
  const std::string layer = name.empty() ? "this linear layer" : name;
  throw Error("precision.recipe=" + recipe_name(recipe) + " on a GPU: " + why + "; " + layer + " has " +
              std::to_string(n) + " tokens, " + std::to_string(in_features) + " input and " +
              std::to_string(out_features) + " output features (use sizes that are multiples of " +
              std::to_string(multiple) + ", e.g. batch x seq and the model's widths, or precision.recipe=bf16)");
}

float* LinearPrecision::device_pending() {
  if (device_pending_ == nullptr) device_pending_ = zeroed(own_pending_, 3, device_);
  return device_pending_;
}

float* LinearPrecision::amax_slot(Operand op) {
  const int at = static_cast<int>(op);
  if (recipe_ == Recipe::Fp8Delayed) return device_pending() + at;
  if (recipe_ == Recipe::Fp8Current) return current_amax_[at];
  return nullptr;
}

float* LinearPrecision::fresh_amax_slot(Operand op) {
  float* slot = scratch_->amaxes.next(device_);
  current_amax_[static_cast<int>(op)] = slot;
  return slot;
}

float* LinearPrecision::produced_amax(Operand op) {
  LOOM_CHECK(op != Operand::Weight, "LinearPrecision::produced_amax: a weight's amax is taken by its cast");
  if (!keeps_input_codes()) return nullptr;
  return recipe_ == Recipe::Fp8Current ? fresh_amax_slot(op) : amax_slot(op);
}

LinearPrecision::ProducedCodes LinearPrecision::produced_codes(Operand op, int64_t rows, int64_t cols,
                                                               void* keep_input_codes) {
  LOOM_CHECK(keeps_input_codes() && op != Operand::Weight && (op == Operand::OutputGrad || keep_input_codes != nullptr),
             "LinearPrecision::produced_codes: an input's or output gradient's codes under per-tensor FP8 on a GPU "
             "(an input's with the memory kept for its weight gradient)");
  ProducedCodes p;
  p.cast = device_cast(recipe_, op, scale(op), margin_);
  if (amax_taken_by_cast()) p.cast.amax_out = amax_slot(op);  // the codes' pass takes it
  if (recipe_ == Recipe::Fp8Current) {
    float* slot = amax_slot(op);  // filled by the producer's amax pass (produced_amax)
    LOOM_CHECK(slot != nullptr, "LinearPrecision::produced_codes: fp8_current's amax is taken into produced_amax's "
                                "float first");
    if (reduces_over_tensor_parallel(op)) max_over_tensor_parallel(*tp_group_, slot);
    p.cast.amax = slot;
  }
  const int64_t bytes = kernels::kept_operand_bytes(OperandCast::Fp8Tensor, rows, cols);
  p.codes = sized_bytes(scratch_->produced_codes, bytes, device_);
  p.transposed = op == Operand::Input ? keep_input_codes : sized_bytes(scratch_->dout_cast, bytes, device_);
  return p;
}

CastOperand LinearPrecision::device_operand(Operand op, const float* x, int64_t n, const void* x16,
                                            const float* given_amax, float* weight_amax) {
  CastOperand c = device_cast(recipe_, op, scale(op), margin_);
  c.data = x;
  float* slot = amax_slot(op);
  LOOM_CHECK(given_amax == nullptr || (slot != nullptr && given_amax == slot),
             "a linear layer's " + std::string(op == Operand::Input ? "input" : "output gradient") +
                 " amax must be taken where its produced_amax gave");
  if (recipe_ == Recipe::Fp8Delayed) {
    // The scale is the host's (from the history); the amax only feeds the next step's history,
    // taken by the GEMM's cast from the read that casts (unless its producer took it). A GEMM
    // reading this operand's kept cast instead takes none; the one that wrote it did.
    if (given_amax == nullptr) c.amax_out = slot;
  } else if (recipe_ == Recipe::Fp8Current) {
    // The scale is computed on the device from this amax (no read back); under tensor parallelism
    // from the whole tensor's, one device float all-reduced over the group (the optimizer's float
    // of a weight in place: the update writes it afresh).
    if (weight_amax != nullptr) {
      LOOM_CHECK(op == Operand::Weight && given_amax == nullptr, "only a weight's amax is the optimizer's");
      slot = weight_amax;
    } else if (given_amax == nullptr) {
      slot = fresh_amax_slot(op);
      if (x16 != nullptr) {
        kernels::amax_into_bf16(device_, slot, x16, n);
      } else {
        kernels::amax_into(device_, slot, x, n);
      }
    }
    if (reduces_over_tensor_parallel(op)) max_over_tensor_parallel(*tp_group_, slot);
    c.amax = slot;
  }
  return c;
}

OptimizerWeightCasts::Entry* LinearPrecision::optimizer_written(kernels::LinearGemm pass, const float* weight,
                                                                int64_t rows, int64_t cols) {
  if (pass != kernels::LinearGemm::Forward || !scratch_->weight_casts.is_open()) return nullptr;
  if (recipe_ != Recipe::Fp8Delayed && recipe_ != Recipe::Fp8Current) return nullptr;
  OptimizerWeightCasts::Entry* e = scratch_->optimizer_casts.want(this, weight, rows, cols, delayed());
  return e != nullptr && e->current ? e : nullptr;
}

LinearPrecision::WrittenStores LinearPrecision::device_weight(kernels::PrecisionGemm& g, const float* weight,
                                                             bool cast_apart) {
  const int64_t rows = g.out_features, cols = g.in_features;
  CastOperand cast = device_cast(recipe_, Operand::Weight, scale(Operand::Weight), margin_);
  WeightCastCache& cache = scratch_->weight_casts;
  g.b_store_transposed = nullptr;
  // The step's first forward of the weight: what the optimizer's last pass wrote of it, if anything.
  OptimizerWeightCasts::Entry* from_optimizer = cache.holds(this, weight, g.pass, cast, rows, cols, device_)
                                                    ? nullptr
                                                    : optimizer_written(g.pass, weight, rows, cols);
  if (from_optimizer != nullptr && from_optimizer->codes && from_optimizer->scale == cast.scale) {
    // fp8_delayed: both forms' codes as the optimizer's pass wrote them under this scale; the
    // history takes the amax that pass took, as a cast of the weight would.
    void* forward = from_optimizer->forward.data();
    void* transposed = from_optimizer->transposed.data();
    cache.lend(this, weight, kernels::LinearGemm::Forward, cast, rows, cols, device_, forward);
    cache.lend(this, weight, kernels::LinearGemm::DataGrad, cast, rows, cols, device_, transposed);
    kernels::amax_into(device_, amax_slot(Operand::Weight), from_optimizer->amax, 1);
    from_optimizer = nullptr;
  }
  WeightCastCache::Store* store = cache.find(this, weight, g.pass, cast, rows, cols, device_);
  if (cast_apart && store != nullptr && !store->ready && cast.cast == kernels::OperandCast::Bf16) {
    // Cast into its store by a pass of its own (the bf16 values the GEMM's cast would write), so
    // the GEMM reads it below and may join its group.
    kernels::narrow_floats(device_, store->data, weight, rows * cols, DType::BF16);
    store->ready = true;
  }
  if (store != nullptr && store->ready) {
    // Cast by an earlier GEMM of this step (or just above): fp8_delayed's pending amax holds this
    // weight's already.
    cast.data = weight;
    g.b = cast;
    g.b_store = store->data;
    g.b_store_use = kernels::CastStore::Read;
    return {};
  }
  // fp8_current: the amax the optimizer's pass took (the codes of fp8_delayed under another scale:
  // cast again, with the amax the cast takes).
  float* weight_amax = from_optimizer != nullptr && !from_optimizer->codes ? from_optimizer->amax : nullptr;
  g.b = device_operand(Operand::Weight, weight, rows * cols, nullptr, nullptr, weight_amax);
  g.b_store = store != nullptr ? store->data : nullptr;
  g.b_store_use = store != nullptr ? kernels::CastStore::Write : kernels::CastStore::None;
  WrittenStores written{store, nullptr};
  // Per-tensor FP8: dgrad's transposed codes under the same scale, from the forward's read.
  if (store != nullptr && g.pass == kernels::LinearGemm::Forward && cast.cast == kernels::OperandCast::Fp8Tensor) {
    WeightCastCache::Store* dgrad = cache.find(this, weight, kernels::LinearGemm::DataGrad, cast, rows, cols, device_);
    if (dgrad != nullptr && !dgrad->ready) {
      g.b_store_transposed = dgrad->data;
      written.transposed = dgrad;
    }
  }
  return written;
}

void LinearPrecision::run_device_gemm(const kernels::PrecisionGemm& g, WrittenStores stores, GemmGroup* group) {
  if (group != nullptr && stores.own == nullptr && stores.transposed == nullptr && kernels::groupable(g)) {
    group->add(g);
    return;
  }
  kernels::precision_linear_gemm(device_, g);
  if (stores.own != nullptr) stores.own->ready = true;
  if (stores.transposed != nullptr) stores.transposed->ready = true;
}

void LinearPrecision::device_forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                                     int64_t in_features, int64_t out_features, bool accumulate, GemmOutput output,
                                     const DeviceTensors& tensors, const float* addend) {
  check_device_shape(recipe_, n, in_features, out_features, name_);
  kernels::PrecisionGemm g;
  g.pass = kernels::LinearGemm::Forward;
  g.fast_accumulation = forward_fast_accumulation_;
  g.out = out;
  g.out16 = tensors.out;
  g.pre_gelu16 = tensors.pre_gelu;
  g.accumulate = accumulate;
  g.addend = addend;
  g.bias = bias;
  // The bias rounded to bf16 is the optimizer's copy of it, where the step has one: no cast per call.
  if (rounding() == kernels::OutputRounding::Bf16 && output == GemmOutput::Rounded)
    g.bias16 = scratch_->weight_casts.bf16_copy_of(bias, out_features);
  g.n = n;
  g.in_features = in_features;
  g.out_features = out_features;
  if (tensors.in_codes != nullptr) {
    // Cast by its producer, the weight gradient's transposed codes too: nothing to cast here.
    g.a = device_cast(recipe_, Operand::Input, scale(Operand::Input), margin_);
    g.a_codes = tensors.in_codes;
  } else {
    // The bf16 recipe: no amax, nothing read; per-tensor FP8 from a bf16 input: its amax, its codes.
    g.a = device_operand(Operand::Input, in, n * in_features, keeps_input_codes() ? tensors.in : nullptr,
                         tensors.in_amax);
    g.a16 = tensors.in;
    g.input_codes = tensors.keep_input_codes;  // cast for the weight gradient too, from the same read
    g.input_codes_use = g.input_codes != nullptr ? kernels::CastStore::Write : kernels::CastStore::None;
  }
  const WrittenStores stores = device_weight(g, weight, tensors.group != nullptr);
  g.rounding = output == GemmOutput::Rounded ? rounding() : kernels::OutputRounding::None;
  run_device_gemm(g, stores, tensors.group);
}

void LinearPrecision::device_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                                      const float* weight, int64_t n, int64_t in_features, int64_t out_features,
                                      GemmOutput din_output, bool accumulate_din, const DeviceTensors& tensors,
                                      bool accumulate_dweight, const std::function<void()>& after_dgrad) {
  check_device_shape(recipe_, n, in_features, out_features, name_);
  LOOM_CHECK(dbias == nullptr || (tensors.dout == nullptr && tensors.dout_codes == nullptr),
             "a bias gradient needs the fp32 output gradient, not bf16 or FP8 codes");
  if (dbias != nullptr)
    kernels::linear_backward(device_, nullptr, nullptr, dbias, dout, nullptr, nullptr, n, in_features, out_features);
  const bool wants_din = din != nullptr || tensors.din != nullptr;
  if (!wants_din && dweight == nullptr) {
    if (after_dgrad) after_dgrad();
    return;
  }
  kernels::PrecisionGemm g;
  g.n = n;
  g.in_features = in_features;
  g.out_features = out_features;
  const bool given_codes = tensors.dout_codes != nullptr;  // cast by its producer, both orientations
  if (given_codes) {
    g.a = device_cast(recipe_, Operand::OutputGrad, scale(Operand::OutputGrad), margin_);
  } else {
    // dout's amax is reduced once for both GEMMs; the device orients block scales along each GEMM's
    // reduction dimension itself (the CPU quantizes a copy per orientation; the amax is the same).
    g.a = device_operand(Operand::OutputGrad, dout, n * out_features, nullptr, tensors.dout_amax);
    g.a16 = tensors.dout;  // handed over in bf16: both GEMMs multiply it
  }
  // dgrad's cast of dout kept for wgrad (kernels::PrecisionGemm::a_store): a 16-bit copy serves
  // as it is; per-tensor FP8 codes are written transposed beside dgrad's from the same read (or
  // were, by the producer of given codes, into the same store).
  const int64_t kept_bytes = kernels::kept_operand_bytes(g.a.cast, n, out_features);
  const bool keep_dout = wants_din && dweight != nullptr && g.a16 == nullptr && kept_bytes > 0 && !given_codes;
  if (keep_dout || given_codes) g.a_store = sized_bytes(scratch_->dout_cast, kept_bytes, device_);
  if (keep_dout) g.a_store_use = kernels::CastStore::Write;
  if (wants_din) {
    g.pass = kernels::LinearGemm::DataGrad;
    g.a_codes = tensors.dout_codes;
    g.out = din;
    g.out16 = tensors.din;
    g.gelu_input16 = tensors.gelu_input;
    g.gelu_bias_grad = tensors.gelu_bias_grad;
    g.accumulate = accumulate_din && tensors.din == nullptr;  // a bf16 din is written whole
    const WrittenStores stores = device_weight(g, weight, tensors.group != nullptr);
    g.rounding = din_output == GemmOutput::Rounded ? rounding() : kernels::OutputRounding::None;
    run_device_gemm(g, stores, tensors.group);
  }
  if (after_dgrad) after_dgrad();
  if (dweight != nullptr) {
    // The weight gradient of one micro-batch, unrounded, added into the fp32 main gradient by the
    // GEMM itself (gradient-accumulation fusion), or written whole into a stale one.
    g.pass = kernels::LinearGemm::WeightGrad;
    g.out = dweight;
    g.accumulate = accumulate_dweight;
    if (tensors.kept_input_codes != nullptr) {
      // The codes the forward kept: no amax (fp8_delayed's pending amax has this input's already).
      g.b = device_cast(recipe_, Operand::Input, scale(Operand::Input), margin_);
      g.b.data = in;
      g.input_codes = const_cast<void*>(tensors.kept_input_codes);  // read only (CastStore::Read)
      g.input_codes_use = kernels::CastStore::Read;
    } else {
      g.b = device_operand(Operand::Input, in, n * in_features);
    }
    g.b16 = takes_bf16_tensors() ? tensors.in : nullptr;  // FP8: the kept codes instead
    g.b_store = nullptr;
    g.b_store_use = kernels::CastStore::None;
    g.b_store_transposed = nullptr;
    g.out16 = nullptr;
    g.gelu_input16 = nullptr;
    g.gelu_bias_grad = nullptr;
    g.a_codes = nullptr;
    g.a_store_use = keep_dout || given_codes ? kernels::CastStore::Read : kernels::CastStore::None;
    g.rounding = kernels::OutputRounding::None;
    run_device_gemm(g, {}, tensors.group);
  }
}

}  // namespace loom::model
