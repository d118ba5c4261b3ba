#include "loom/plan/cast_time.h"

#include "loom/parallel/data/bf16_parameter_copy.h"
#include "loom/parallel/data/fp8_weight_pieces.h"
#include "loom/plan/activation_memory.h"

namespace loom::plan {

namespace {

// What a precision recipe adds to one linear's three GEMMs over `n` rows, for one rank alone (linear_precision.h):
// each operand copied and cast, the forward's and dgrad's outputs rounded in place, and the weight
// gradient added unrounded into its fp32 main gradient. The CPU casts the input and the weight twice
// and the output gradient once (once per GEMM for block-scaled recipes); a GPU casts the input
// twice, the output gradient once under bf16 / fp16 and once per GEMM otherwise (FP8's wgrad
// wants it transposed; per-tensor FP8 casts the input and the output gradient once each, into
// both orientations), and the weight once per step and form (one 16-bit copy; two FP8 or MX
// forms, per-tensor FP8's from one read). Recompute casts the forward's input again (and on the
// CPU its weight). `bf16`: the tensors a GPU hands over in bf16 (LinearPrecision's
// DeviceTensors), whose casts and widenings are not made.
double linear_cast_seconds(double n, double out, double in, model::Recipe recipe, bool recompute, const Hardware& hw,
                           const CastPath& path, const Bf16Ends& bf16 = {}) {
  if (recipe == model::Recipe::Fp32) return 0.0;
  const bool oriented = recipe == model::Recipe::Fp8Blockwise || recipe == model::Recipe::Mxfp8;
  const bool sixteen = recipe == model::Recipe::Bf16 || recipe == model::Recipe::Fp16;
  const double weight = out * in;
  // Per-tensor FP8 on a GPU casts the input, the output gradient and the weight once each into
  // both orientations (LinearPrecision's kept input codes, PrecisionGemm::a_store,
  // b_store_transposed): 10 bytes per element (the amax's read, one read, two 1-byte writes) where
  // a cast moves 9, so 10/9 of a cast.
  const bool both_orientations =
      path.device && (recipe == model::Recipe::Fp8Delayed || recipe == model::Recipe::Fp8Current);
  // With its amax taken by its producer: 6 bytes (one read, two 1-byte writes), 6/9 of a cast.
  // fp8_delayed's casts take the amax from their own read (LinearPrecision::amax_taken_by_cast), so
  // none of its operands has an amax pass: 6/9 each.
  constexpr double kAmaxGiven = 6.0 / 9.0;
  const double amax_pass = path.device && recipe == model::Recipe::Fp8Delayed ? 0.0 : 4.0 / 9.0;
  const double unaided = kAmaxGiven + amax_pass;
  const double input_cast = (bf16.input_amax ? kAmaxGiven : unaided) - bf16.input_pass_saved / 9.0;
  const double output_grad_cast = bf16.output_grad_produced ? bf16.output_grad_produced_bytes / 9.0
                                  : bf16.output_grad_amax   ? kAmaxGiven
                                                            : unaided;
  double cast = 0.0;
  if (both_orientations) {
    const double weight_cast = !path.fp8_weights_from_optimizer          ? unaided
                               : recipe == model::Recipe::Fp8Delayed ? 2.0 / 9.0
                                                                       : kAmaxGiven;
    cast = input_cast * n * in + output_grad_cast * n * out + weight_cast * weight / path.micro_batches;
  } else if (path.device) {
    const bool copied = path.bf16_weight_copy && recipe == model::Recipe::Bf16;
    cast = n * (2.0 * in + (sixteen ? 1.0 : 2.0) * out) +
           (copied ? 0.0 : (sixteen ? 1.0 : 2.0) * weight / path.micro_batches);
  } else {
    cast = n * (2.0 * in + (oriented ? 2.0 : 1.0) * out) + 2.0 * weight;
  }
  double rounded = n * (out + in);
  if (recompute) {
    cast += (both_orientations ? input_cast : 1.0) * n * in + (path.device ? 0.0 : weight);
    rounded += n * out;
  }
  if (bf16.output) rounded -= (recompute ? 2.0 : 1.0) * n * out;
  if (bf16.output_grad) cast -= n * out;
  if (bf16.output_grad_from_norm) cast -= (4.0 / 6.0) * n * out;
  if (bf16.input) cast -= (recompute ? 3.0 : 2.0) * n * in;
  if (bf16.input_grad) rounded -= n * in;
  // Read from bf16: its cast's read and its amax pass's (if any) read 2 bytes, not 4.
  if (bf16.input_bf16 && both_orientations) cast -= (recompute ? 2.0 : 1.0) * (2.0 / 9.0 + amax_pass / 2.0) * n * in;
  // The weight gradient added unrounded into its fp32 main gradient: on the CPU a pass of its own
  // (read two, write one: 12 bytes); a GPU's wgrad GEMM adds it in its epilogue (gradient-
  // accumulation fusion). The data gradient is written whole, each of these linears being its only
  // producer.
  const double added = path.device ? 0.0 : weight;
  return hw.cast_seconds(cast, model::is_fp8(recipe), 1) + hw.cast_seconds(rounded, false, 1) +
         12.0 * added / hw.bandwidth_per_rank(1);
}

}  // namespace

Bf16Ends device_bf16_ends(const CastPath& path, model::Recipe r, LinearRole role) {
  Bf16Ends ends;
  if (!path.device || r == model::Recipe::Fp32 || r == model::Recipe::Fp16) return ends;
  const bool qkv = role == LinearRole::AttentionQkv, o = role == LinearRole::AttentionOut;
  const bool up = role == LinearRole::MlpUp, down = role == LinearRole::MlpDown;
  if (r == model::Recipe::Bf16 && is_expert(role)) {
    // The routed experts' bf16 interior (ExpertMlp): the up projections' output and output gradient,
    // the down projections' input and input gradient; their input and output gradient cast once.
    const bool expert_up = role == LinearRole::ExpertUp;
    ends.output = ends.output_grad = expert_up;
    ends.input = ends.input_grad = !expert_up;
    return ends;
  }
  if (r == model::Recipe::Bf16) {
    // The norms' outputs into q/k/v and up (Norm::forward's bf16 output); the MLP's interior
    // (Mlp::bf16_interior; a bias's gradient summed by the activation's backward from the fp32 hidden
    // gradient); attention's tensors (Attention::bf16_tensors).
    ends.input = qkv || up || down || (o && path.bf16_attention);
    ends.output = up || (qkv && path.bf16_attention);
    ends.output_grad = up || (qkv && path.bf16_qkv_gradient);
    ends.input_grad = down || (o && path.bf16_attention) || ((qkv || up) && path.bf16_normed_grad);
    // The output projections' gradient (the residual stream's), from the norm that updated it.
    ends.output_grad_from_norm = (down || (o && path.bf16_attention)) && path.bf16_normed_grad;
    return ends;
  }
  // FP8 and MX: the MLP keeps its GEMMs' bf16 outputs (Mlp::bf16_hidden); per-tensor FP8 also
  // attention's tensors, the output projection casting its codes from bf16, and the activation's
  // kernels take the amaxes of the down projection's input and the up projection's output gradient.
  const bool per_tensor = r == model::Recipe::Fp8Delayed || r == model::Recipe::Fp8Current;
  const bool attention = path.bf16_attention && per_tensor;
  // The routed experts likewise (ExpertMlp's bf16 hidden): the up projections' output, the down
  // projections' input gradient.
  if (is_expert(role)) {
    ends.output = role == LinearRole::ExpertUp;
    ends.input_grad = role == LinearRole::ExpertDown;
    return ends;
  }
  ends.output = up || (qkv && attention);
  ends.input_grad = down || (o && attention) || ((qkv || up) && path.bf16_normed_grad);
  ends.input_bf16 = o && attention;
  // The input's amax taken by its producer: the activation (down), or the norm writing the codes
  // (q/k/v, up; the norm's fp32 output, no longer written, is off the elementwise count).
  ends.input_amax = per_tensor && (down || ((qkv || up) && path.normed_codes));
  // The output gradient's amax taken by its producer: the activation's backward (up), the norm
  // backwards that last updated the residual stream's gradient (down, and the output projection;
  // ResidualGradForReader), attention's backward writing the q/k/v gradient whole in fp32.
  ends.output_grad_amax =
      per_tensor && (up || ((down || o) && path.residual_grad_amax) || (qkv && attention));
  if (per_tensor && path.mlp_codes) {
    const bool delayed = r == model::Recipe::Fp8Delayed;  // no amax-only pass before the codes
    if (up) {
      const double read = path.swiglu ? 3.0 : 4.0;  // per hidden element: the activation's inputs
      ends.output_grad_produced = true;
      ends.output_grad_produced_bytes = read + 2.0 - 4.0 - (delayed ? read : 0.0);
    }
    if (down && delayed) ends.input_pass_saved = path.swiglu ? 4.0 : 2.0;  // the hidden, per activation element
  }
  return ends;
}

CastPath cast_path(const config::RunConfig& config, double micro_batches, int tp) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  const bool device = config.runtime.device == config::RuntimeDevice::Cuda;
  CastPath path{device, micro_batches, bf16_logits_on_device(config, tp),
                device && policy.attention_operands() == kernels::AttentionOperands::Bf16 && config.parallel.cp <= 1};
  path.bf16_qkv_gradient =
      path.bf16_attention && (config.model.positions != config::Positions::Rope || !config.model.bias);
  path.mlp_codes = fp8_mlp_codes_on_device(config);
  path.normed_codes = fp8_normed_codes_on_device(config, tp);
  path.swiglu = config.model.activation == config::Activation::Swiglu;
  path.bf16_weight_copy = parallel::keeps_bf16_parameter_copy(config);
  path.fp8_weights_from_optimizer = parallel::keeps_fp8_weight_casts(config);
  path.bf16_normed_grad = device && tp == 1;
  path.residual_grad_amax = device && !(config.parallel.sequence_parallel && tp > 1);
  return path;
}

double cast_seconds(const config::RunConfig& config, const StageMemory& stage, double tokens, double micro_batches,
                    int tp, const Hardware& hw) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  if (policy.recipe == model::Recipe::Fp32 || !hw.costs_casts()) return 0.0;
  const bool recompute = config.model.recompute;
  const CastPath path = cast_path(config, micro_batches, tp);
  double s = 0.0;
  for_each_block_linear(config, stage, tokens,
                        [&](double out, double in, model::Recipe r, LinearRole role, double rows) {
    s += linear_cast_seconds(tokens * rows, out, in, r, recompute, hw, path, device_bf16_ends(path, r, role));
  });
  if (stage.head_rows > 0) {
    s += linear_cast_seconds(tokens, static_cast<double>(stage.head_rows), static_cast<double>(config.model.d_model),
                             policy.head_recipe(), false, hw, path,
                             Bf16Ends{.output = path.bf16_logits, .output_grad = path.bf16_logits});
  }
  return s;
}

}  // namespace loom::plan
