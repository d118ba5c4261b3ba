#include "loom/model/linear_precision.h"
#include "loom/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>

#include "loom/comm/communicator.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/parallel.h"
#include "loom/precision/formats.h"
#include "loom/precision/mx.h"

namespace loom::model {

namespace p = loom::precision;

// The recipes quantize and round on the host (precision/ is host code), so their GEMMs run there.
constexpr Device kHost = Device::cpu();

namespace {

// dst = base + src (n elements; base may be dst: dst += src).
void add_into(float* dst, const float* base, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (kernels::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) dst[i] = base[i] + src[i];
}

// out[cols, rows] = in[rows, cols]^T, in cache-sized tiles.
void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

}  // namespace

Recipe parse_recipe(const std::string& name) { return config::parse_name<Recipe>(name, "precision.recipe"); }

std::string recipe_name(Recipe recipe) { return config::to_string(recipe); }

bool is_fp8(Recipe recipe) {
  return recipe == Recipe::Fp8Delayed || recipe == Recipe::Fp8Current || recipe == Recipe::Fp8Blockwise ||
         recipe == Recipe::Mxfp8;
}

int64_t scaling_block(Recipe recipe) {
  if (recipe == Recipe::Fp8Blockwise) return p::kBlockwiseSize;
  if (recipe == Recipe::Mxfp8) return p::kMxBlockSize;
  return 0;
}

PrecisionPolicy PrecisionPolicy::from_config(const config::PrecisionConfig& config) {
  PrecisionPolicy policy;
  policy.recipe = config.recipe;
  policy.amax_history = config.fp8_amax_history;
  policy.margin = config.fp8_margin;
  policy.edge_layers_bf16 = config.fp8_edge_layers_bf16;
  policy.forward_fast_accumulation = config.fp8_forward_fast_accumulation;
  policy.gelu_epilogue = config.gelu_epilogue;
  policy.attention = config.attention;
  return policy;
}

kernels::AttentionOperands PrecisionPolicy::attention_operands() const {
  using config::AttentionPrecision;
  const bool bf16 = attention == AttentionPrecision::Bf16 ||
                    (attention == AttentionPrecision::Auto && recipe != Recipe::Fp32 && recipe != Recipe::Fp16);
  return bf16 ? kernels::AttentionOperands::Bf16 : kernels::AttentionOperands::Fp32;
}

Recipe PrecisionPolicy::block_recipe(int layer, int layers) const {
  if (is_fp8(recipe) && edge_layers_bf16 && (layer == 0 || layer == layers - 1)) return Recipe::Bf16;
  return recipe;
}

Recipe sixteen_bit_recipe(Recipe recipe) { return is_fp8(recipe) ? Recipe::Bf16 : recipe; }

Recipe PrecisionPolicy::head_recipe() const { return sixteen_bit_recipe(recipe); }

LinearPrecision::LinearPrecision(Recipe recipe, int amax_history, int margin, std::shared_ptr<PrecisionScratch> scratch)
    : recipe_(recipe), margin_(margin), scratch_(std::move(scratch)) {
  LOOM_CHECK(recipe != Recipe::Fp32, "LinearPrecision: the fp32 recipe needs no object (call the fp32 kernels)");
  LOOM_CHECK(amax_history >= 1 && margin >= 0, "LinearPrecision: amax history must be >= 1 and margin >= 0");
  if (!scratch_) scratch_ = std::make_shared<PrecisionScratch>();
  if (recipe == Recipe::Fp8Delayed) {
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      scaling_.emplace_back(format(op), amax_history, margin);
    }
  }
}

void LinearPrecision::set_sharded_operands(comm::Communicator* group, std::array<bool, 3> sharded) {
  tp_group_ = group;
  sharded_ = sharded;
}

bool LinearPrecision::reduces_over_tensor_parallel(Operand op) const {
  // Only a per-tensor scale computed now needs the whole tensor's amax: fp8_delayed's histories
  // are reduced over the world once per step, and block scales never leave their block.
  return recipe_ == Recipe::Fp8Current && tp_group_ != nullptr && tp_group_->size() > 1 &&
         sharded_[static_cast<int>(op)];
}

float LinearPrecision::global_amax(Operand op, float local) const {
  if (!reduces_over_tensor_parallel(op)) return local;
  return max_over_tensor_parallel(*tp_group_, local);  // NaN propagates: all pass through
}

void LinearPrecision::set_device(Device device) {
  device_ = device;
  device_pending_ = nullptr;  // a context hands out its slots again; a layer alone makes its own
  own_pending_ = Buffer();
}

p::Fp8Format LinearPrecision::format(Operand op) const {
  // Per-tensor recipes (TE's HYBRID format): gradients need E5M2's range. Block-scaled recipes
  // give every block its own range and use E4M3's precision everywhere.
  const bool per_tensor = recipe_ == Recipe::Fp8Delayed || recipe_ == Recipe::Fp8Current;
  return per_tensor && op == Operand::OutputGrad ? p::Fp8Format::E5M2 : p::Fp8Format::E4M3;
}

float LinearPrecision::scale(Operand op) const {
  return recipe_ == Recipe::Fp8Delayed ? scaling_[static_cast<int>(op)].scale() : 1.0f;
}

void LinearPrecision::commit_amaxes(const float* amaxes) {
  record_amaxes(amaxes);
  clear_pending();
}

void LinearPrecision::record_amaxes(const float* amaxes) {
  if (recipe_ == Recipe::Fp8Delayed) {
    for (int i = 0; i < 3; ++i) scaling_[i].update(amaxes[i]);  // non-finite ones are not recorded
  }
}

float LinearPrecision::pending_amax(Operand op) const {
  if (device_.is_cpu() || device_pending_ == nullptr) return pending_[static_cast<int>(op)];
  float a = 0.0f;
  copy_to_host(device_, &a, device_pending_ + static_cast<int>(op), 1);
  return std::isfinite(a) ? a : INFINITY;
}

void LinearPrecision::clear_pending() {
  std::fill(pending_, pending_ + 3, 0.0f);
  if (!device_.is_cpu() && device_pending_ != nullptr) zero_on_device(device_, device_pending_, 3);
}

void LinearPrecision::restore_delayed(Operand op, const p::DelayedScalingState& state) {
  LOOM_CHECK(recipe_ == Recipe::Fp8Delayed, "LinearPrecision: only fp8_delayed has scaling state to restore");
  scaling_[static_cast<int>(op)].restore(state);
}

void LinearPrecision::quantize_fp8(Operand op, GemmPass pass, float* buf, int64_t rows, int64_t cols,
                                   float tensor_amax) {
  const int64_t n = rows * cols;
  const p::Fp8Format f = format(op);
  switch (recipe_) {
    case Recipe::Fp8Delayed: {
      float& pending = pending_[static_cast<int>(op)];
      pending = std::max(pending, tensor_amax);
      p::quantize_dequantize_fp8(buf, n, f, scaling_[static_cast<int>(op)].scale());
      return;
    }
    case Recipe::Fp8Current:
      // As precision::CurrentScaling (previous scale 1 for an all-zero tensor).
      p::quantize_dequantize_fp8(buf, n, f, p::compute_scale(tensor_amax, p::max_finite(f), margin_, 1.0f));
      return;
    case Recipe::Fp8Blockwise: {
      if (op == Operand::Weight) {
        p::quantize_dequantize_tile_blocks(buf, rows, cols, f);  // 128x128 tiles: the same for W and W^T
      } else if (pass == GemmPass::WeightGrad) {
        // wgrad reduces over the rows: 128x1 blocks down each column.
        float* t = sized(scratch_->transposed, n);
        transpose(buf, t, rows, cols);
        p::quantize_dequantize_rowwise_blocks(t, cols, rows, f);
        transpose(t, buf, cols, rows);
      } else {
        p::quantize_dequantize_rowwise_blocks(buf, rows, cols, f);
      }
      return;
    }
    case Recipe::Mxfp8: {
      // Blocks of 32 along the pass's reduction dimension: along the rows of in / W / dout for
      // forward and dgrad's dout; down the columns of W for dgrad and of dout / in for wgrad.
      const bool columns = (op == Operand::Weight && pass == GemmPass::DataGrad) || pass == GemmPass::WeightGrad;
      if (columns) {
        p::quantize_dequantize_mx_columns(buf, rows, cols, f);
      } else {
        p::quantize_dequantize_mx(buf, rows, cols, f);
      }
      return;
    }
    default:
      return;
  }
}

const float* LinearPrecision::prepare(Operand op, GemmPass pass, const float* x, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  float* buf = sized(scratch_->operand[static_cast<int>(op)], n);
  std::copy(x, x + n, buf);
  if (recipe_ == Recipe::Bf16) {
    p::round_to_bf16(buf, n);
  } else if (recipe_ == Recipe::Fp16) {
    p::round_to_fp16(buf, n);  // non-saturating: an overflow becomes Inf
  } else {
    const float a = global_amax(op, p::amax(x, n));
    if (!std::isfinite(a)) {
      // Left as it is, so the Inf/NaN reaches the gradients' check instead of saturating.
      if (recipe_ == Recipe::Fp8Delayed) pending_[static_cast<int>(op)] = INFINITY;
      return buf;
    }
    quantize_fp8(op, pass, buf, rows, cols, a);
  }
  return buf;
}

kernels::OutputRounding LinearPrecision::rounding() const {
  return recipe_ == Recipe::Fp16 ? kernels::OutputRounding::Fp16 : kernels::OutputRounding::Bf16;
}

void LinearPrecision::round_output(float* data, int64_t n) const {
  if (!device_.is_cpu()) {
    kernels::round_in_place(device_, data, n, rounding());
    return;
  }
  if (recipe_ == Recipe::Fp16) {
    p::round_to_fp16(data, n);
  } else {
    p::round_to_bf16(data, n);  // bf16, and the bf16 activations of the FP8 recipes
  }
}

float* LinearPrecision::output_scratch(int64_t n) { return sized(scratch_->out, n); }

const float* LinearPrecision::rounded_bias(const float* bias, int64_t n) const {
  if (bias == nullptr || n == 0) return bias;
  float* copy = sized(scratch_->bias, n, device_);
  allocator(device_).copy(copy, bias, static_cast<size_t>(n) * sizeof(float));
  round_output(copy, n);
  return copy;
}

void LinearPrecision::check_device_tensors(const DeviceTensors& tensors) const {
  LOOM_CHECK(tensors.group == nullptr || !device_.is_cpu(),
             "a linear layer's GEMMs run in a group on a GPU only (the CPU runs each at once)");
  LOOM_CHECK(tensors.dout == nullptr || takes_bf16_tensors(),
             "a linear layer's GEMMs take a bf16 output gradient under the bf16 recipe on a GPU only (this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK(tensors.in == nullptr || takes_bf16_tensors() ||
                 (keeps_input_codes() && (tensors.keep_input_codes != nullptr || tensors.kept_input_codes != nullptr)),
             "a linear layer's GEMMs take a bf16 input under the bf16 recipe, or under fp8_delayed / fp8_current "
             "keeping its FP8 codes, on a GPU only (this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK((tensors.out == nullptr && tensors.din == nullptr) || gives_bf16_outputs(),
             "a linear layer's GEMMs leave bf16 outputs on a GPU under a recipe rounding them to bf16 only "
             "(this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK((tensors.keep_input_codes == nullptr && tensors.kept_input_codes == nullptr) || keeps_input_codes(),
             "a linear layer keeps its input's FP8 codes under fp8_delayed or fp8_current on a GPU only (this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK((tensors.in_amax == nullptr && tensors.dout_amax == nullptr) || keeps_input_codes(),
             "a linear layer takes an amax its operand's producer took under fp8_delayed or fp8_current on a GPU "
             "only (this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK((tensors.in_codes == nullptr && tensors.dout_codes == nullptr) || keeps_input_codes(),
             "a linear layer takes FP8 codes its operand's producer wrote under fp8_delayed or fp8_current on a GPU "
             "only (this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK(tensors.in_codes == nullptr || (tensors.in == nullptr && tensors.in_amax == nullptr &&
                                             tensors.keep_input_codes == nullptr),
             "a linear layer's input given as its producer's FP8 codes comes with nothing else of it (its transposed "
             "codes are written already)");
  LOOM_CHECK(tensors.dout_codes == nullptr || (tensors.dout == nullptr && tensors.dout_amax == nullptr),
             "a linear layer's output gradient given as its producer's FP8 codes comes with nothing else of it");
  LOOM_CHECK((tensors.pre_gelu == nullptr && tensors.gelu_input == nullptr && tensors.gelu_bias_grad == nullptr) ||
                 takes_bf16_tensors(),
             "a linear layer's GEMMs apply GELU in their epilogue under the bf16 recipe on a GPU only (this one: " +
                 recipe_name(recipe_) + " on " + device_.name() + ")");
  LOOM_CHECK((tensors.pre_gelu == nullptr || tensors.out != nullptr) &&
                 (tensors.gelu_input == nullptr || tensors.din != nullptr) &&
                 (tensors.gelu_bias_grad == nullptr || tensors.gelu_input != nullptr),
             "a linear layer's GELU epilogue writes its bf16 output (out, din), and a GELU input's bias gradient "
             "comes with GELU's derivative (gelu_input)");
}

void LinearPrecision::forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                              int64_t in_features, int64_t out_features, bool accumulate, GemmOutput output,
                              const DeviceTensors& tensors, const float* addend) {
  if (n == 0 || out_features == 0) return;
  check_device_tensors(tensors);
  LOOM_CHECK(addend == nullptr || accumulate, "LinearPrecision::forward: an addend is for an accumulating output");
  if (!device_.is_cpu())
    return device_forward(out, in, weight, bias, n, in_features, out_features, accumulate, output, tensors, addend);
  const float* x = prepare(Operand::Input, GemmPass::Forward, in, n, in_features);
  const float* w = prepare(Operand::Weight, GemmPass::Forward, weight, out_features, in_features);
  const int64_t count = n * out_features;
  float* y = accumulate ? output_scratch(count) : out;
  const bool rounded = output == GemmOutput::Rounded;
  kernels::linear_forward(kHost, y, x, w, rounded ? rounded_bias(bias, out_features) : bias, n, in_features,
                          out_features, false);
  if (rounded) round_output(y, count);
  if (accumulate) add_into(out, addend != nullptr ? addend : out, y, count);
}

void LinearPrecision::backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                               const float* weight, int64_t n, int64_t in_features, int64_t out_features,
                               GemmOutput din_output, bool accumulate_din, const DeviceTensors& tensors,
                               bool accumulate_dweight, const std::function<void()>& after_dgrad) {
  if (n == 0) {
    if (after_dgrad) after_dgrad();
    return;
  }
  check_device_tensors(tensors);
  if (!device_.is_cpu())
    return device_backward(din, dweight, dbias, dout, in, weight, n, in_features, out_features, din_output,
                           accumulate_din, tensors, accumulate_dweight, after_dgrad);
  if (dbias != nullptr)
    kernels::linear_backward(kHost, nullptr, nullptr, dbias, dout, nullptr, nullptr, n, in_features, out_features);
  // Per-tensor recipes quantize dout the same way for both GEMMs; block-scaled ones block it
  // along each GEMM's reduction dimension.
  const bool oriented = recipe_ == Recipe::Fp8Blockwise || recipe_ == Recipe::Mxfp8;
  const float* g = nullptr;
  if (din != nullptr) {
    g = prepare(Operand::OutputGrad, GemmPass::DataGrad, dout, n, out_features);
    const float* w = prepare(Operand::Weight, GemmPass::DataGrad, weight, out_features, in_features);
    float* y = accumulate_din ? output_scratch(n * in_features) : din;
    kernels::gemm(kHost, y, g, w, n, in_features, out_features, false, false, false);
    if (din_output == GemmOutput::Rounded) round_output(y, n * in_features);
    if (accumulate_din) add_into(din, din, y, n * in_features);
  }
  if (after_dgrad) after_dgrad();
  if (dweight != nullptr) {
    if (g == nullptr || oriented) g = prepare(Operand::OutputGrad, GemmPass::WeightGrad, dout, n, out_features);
    const float* x = prepare(Operand::Input, GemmPass::WeightGrad, in, n, in_features);
    float* y = accumulate_dweight ? output_scratch(out_features * in_features) : dweight;
    kernels::gemm(kHost, y, g, x, out_features, in_features, n, true, false, false);
    // The weight gradient of one micro-batch added unrounded into the fp32 main gradient, as
    // Megatron's gradient-accumulation fusion does (a GPU's wgrad GEMM adds its fp32 accumulator
    // into main_grad in its epilogue: one rounding, of the sum, as this add makes).
    if (accumulate_dweight) add_into(dweight, dweight, y, out_features * in_features);
  }
}

PrecisionContext::PrecisionContext(PrecisionPolicy policy)
    : policy_(policy), scratch_(std::make_shared<PrecisionScratch>()) {}

void PrecisionContext::set_device(Device device) {
  device_ = device;
  for (const auto& l : layers_) l->set_device(device);
  place_device_pending();
}

void PrecisionContext::place_device_pending() {
  int64_t delayed = 0;
  for (const auto& l : layers_) delayed += l->delayed() ? 1 : 0;
  if (device_.is_cpu() || delayed == 0) {
    device_pending_ = Buffer();
    return;
  }
  device_pending_ = Buffer(device_, 3 * delayed);  // zeroed
  float* slots = device_pending_.data();
  for (const auto& l : layers_) {
    if (!l->delayed()) continue;
    l->set_pending_slots(slots);
    slots += 3;
  }
}

std::shared_ptr<LinearPrecision> PrecisionContext::make(Recipe recipe, const std::string& name) {
  if (recipe == Recipe::Fp32) return nullptr;
  auto layer = std::make_shared<LinearPrecision>(recipe, policy_.amax_history, policy_.margin, scratch_);
  layer->set_name(name);
  layer->set_forward_fast_accumulation(policy_.forward_fast_accumulation);
  layer->set_device(device_);
  layers_.push_back(layer);
  names_.push_back(name);
  if (layer->delayed() && !device_.is_cpu()) place_device_pending();  // made before any GEMM runs
  return layer;
}

bool PrecisionContext::has_delayed() const {
  return std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->delayed(); });
}

std::vector<float> PrecisionContext::pending_amaxes() const {
  std::vector<float> out;
  if (device_pending_.size() > 0) {  // one read for every layer (a non-finite amax as +Inf, as on the CPU)
    out.resize(static_cast<size_t>(device_pending_.size()));
    copy_to_host(device_, out.data(), device_pending_.data(), device_pending_.size());
    for (float& a : out) a = std::isfinite(a) ? a : INFINITY;
    return out;
  }
  for (const auto& l : layers_) {
    if (!l->delayed()) continue;
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) out.push_back(l->pending_amax(op));
  }
  return out;
}

void PrecisionContext::commit_amaxes(const std::vector<float>& amaxes) {
  size_t at = 0;
  for (const auto& l : layers_) {
    if (!l->delayed()) continue;
    LOOM_CHECK(at + 3 <= amaxes.size(), "PrecisionContext::commit_amaxes: too few amaxes");
    l->record_amaxes(amaxes.data() + at);
    at += 3;
  }
  LOOM_CHECK(at == amaxes.size(), "PrecisionContext::commit_amaxes: too many amaxes");
  clear_pending();  // on a device every layer's pending amaxes in one zeroing
}

void PrecisionContext::clear_pending() {
  if (device_pending_.size() > 0) device_pending_.zero();  // every delayed layer's slots at once
  for (const auto& l : layers_) {
    if (device_pending_.size() == 0 || !l->delayed()) l->clear_pending();
  }
}

nlohmann::json PrecisionContext::state() const {
  nlohmann::json layers = nlohmann::json::object();
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->delayed()) continue;
    nlohmann::json ops = nlohmann::json::array();
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      const p::DelayedScalingState& s = layers_[i]->delayed_scaling(op).state();
      ops.push_back({{"amax_history", s.amax_history}, {"next", s.next}, {"scale", s.scale}});
    }
    layers[names_[i]] = ops;
  }
  if (layers.empty()) return nlohmann::json();
  return nlohmann::json{{"fp8_delayed", layers}};
}

void PrecisionContext::restore(const nlohmann::json& state) {
  if (state.is_null() || !state.contains("fp8_delayed")) return;
  const nlohmann::json& layers = state.at("fp8_delayed");
  LOOM_CHECK(layers.is_object(), "checkpoint: fp8_delayed scaling state must map GEMM names to their histories");
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->delayed()) continue;
    LOOM_CHECK(layers.contains(names_[i]), "checkpoint: no fp8_delayed scaling state for " + names_[i] +
                                          " (written for a different model or recipe?)");
    const nlohmann::json& ops = layers.at(names_[i]);
    int k = 0;
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      const nlohmann::json& s = ops.at(k++);
      p::DelayedScalingState restored;
      restored.amax_history = s.at("amax_history").get<std::vector<float>>();
      restored.next = s.at("next").get<int64_t>();
      restored.scale = s.at("scale").get<float>();
      layers_[i]->restore_delayed(op, restored);
    }
  }
}

}  // namespace loom::model
