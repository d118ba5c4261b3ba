#include "loom/model/expert_mlp.h"

#include <numeric>

#include "loom/kernels/ops.h"
#include "loom/model/gemm_group.h"

namespace loom::model {

namespace {
// Element `at` of a device tensor of 16-bit elements.
void* at16(void* p, int64_t at) { return static_cast<uint16_t*>(p) + at; }
const void* at16(const void* p, int64_t at) { return static_cast<const uint16_t*>(p) + at; }
}  // namespace

void stored_linear_forward(ParameterStore& store, LinearPrecision* precision, int id, float* out, const float* in,
                           int64_t n, int64_t in_features, int64_t out_features) {
  if (precision != nullptr) {
    precision->forward(out, in, store.value(id), nullptr, n, in_features, out_features);
  } else {
    kernels::linear_forward(store.device(), out, in, store.value(id), nullptr, n, in_features, out_features);
  }
}

void stored_linear_backward(ParameterStore& store, LinearPrecision* precision, int id, float* d_in,
                            const float* d_out, const float* in, int64_t n, int64_t in_features,
                            int64_t out_features) {
  if (precision != nullptr) {
    precision->backward(d_in, store.grad(id), nullptr, d_out, in, store.value(id), n, in_features, out_features);
  } else {
    kernels::linear_backward(store.device(), d_in, store.grad(id), nullptr, d_out, in, store.value(id), n,
                             in_features, out_features);
  }
}

ExpertMlp::ExpertMlp(ParameterStore& store, const ShardSpec& placement, const std::string& prefix, int first,
                     int count, int width, int ffn_size, config::Activation activation, float init_std,
                     float out_std)
    : store_(&store),
      device_(store.device()),
      first_(first),
      count_(count),
      width_(width),
      ffn_(ffn_size),
      activation_(activation) {
  const bool swiglu = activation == config::Activation::Swiglu;
  for (int j = 0; j < count; ++j) {
    const std::string name = prefix + ".experts." + std::to_string(first + j);
    if (swiglu) {
      in_.push_back(store.add(name + ".gate_proj.weight", {ffn_size, width}, Init::Normal, init_std, placement));
      store.add(name + ".up_proj.weight", {ffn_size, width}, Init::Normal, init_std, placement);
    } else {
      in_.push_back(store.add(name + ".up_proj.weight", {ffn_size, width}, Init::Normal, init_std, placement));
    }
    down_.push_back(store.add(name + ".down_proj.weight", {width, ffn_size}, Init::Normal, out_std, placement));
  }
}

void ExpertMlp::set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix, int experts) {
  in_precision_.clear();
  down_precision_.clear();
  for (int e = 0; e < experts; ++e) {
    const std::string name = prefix + ".experts." + std::to_string(e);
    std::shared_ptr<LinearPrecision> in = context.make(recipe, name + ".up_proj");
    std::shared_ptr<LinearPrecision> down = context.make(recipe, name + ".down_proj");
    if (e < first_ || e >= first_ + count_) continue;  // another rank's: its slots and history only
    in_precision_.push_back(std::move(in));
    down_precision_.push_back(std::move(down));
  }
  // Padded on the CPU too: its sums then run over the rows a GPU's do (a GEMM's summation may
  // split its reduction by its length), so the emulated device trains as the CPU bit for bit.
  row_multiple_ = device_gemm_multiple(recipe);
}

std::vector<int64_t> ExpertMlp::padded_rows(const std::vector<int64_t>& expert_rows) const {
  std::vector<int64_t> padded(expert_rows);
  for (int64_t& n : padded) n = (n + row_multiple_ - 1) / row_multiple_ * row_multiple_;
  return padded;
}

ExpertMlp::Padding ExpertMlp::plan_padding(ExpertScratch& scratch, const std::vector<int64_t>& expert_rows) const {
  Padding p;
  p.rows = padded_rows(expert_rows);
  if (p.rows == expert_rows) return p;
  scratch.pad.clear();
  scratch.unpad.clear();
  for (size_t j = 0; j < expert_rows.size(); ++j) {
    for (int64_t i = 0; i < p.rows[j]; ++i) {
      scratch.pad.push_back(i < expert_rows[j] ? static_cast<int32_t>(p.unpadded + i) : -1);
    }
    for (int64_t i = 0; i < expert_rows[j]; ++i) scratch.unpad.push_back(static_cast<int32_t>(p.total + i));
    p.unpadded += expert_rows[j];
    p.total += p.rows[j];
  }
  p.pad = scratch.pad_on_device.stage(device_, scratch.pad.data(), p.total);
  p.unpad = scratch.unpad_on_device.stage(device_, scratch.unpad.data(), p.unpadded);
  return p;
}

const float* ExpertMlp::pad(Buffer& buffer, const float* x, const Padding& p) const {
  float* padded = sized(buffer, p.total * width_, device_);
  kernels::gather_rows(device_, padded, x, p.pad, nullptr, p.total, width_);
  return padded;
}

LinearPrecision* ExpertMlp::precision_of(const std::vector<std::shared_ptr<LinearPrecision>>& layers, int j) {
  return layers.empty() ? nullptr : layers[static_cast<size_t>(j)].get();
}

void ExpertMlp::forward(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows,
                        ExpertScratch& scratch) const {
  const Padding p = plan_padding(scratch, expert_rows);
  if (p.pad == nullptr) {
    forward_grouped(saved, out, in, expert_rows, scratch);
    return;
  }
  float* padded_out = sized(scratch.out, p.total * width_, device_);
  forward_grouped(saved, padded_out, pad(scratch.in, in, p), p.rows, scratch);
  kernels::gather_rows(device_, out, padded_out, p.unpad, nullptr, p.unpadded, width_);
}

void ExpertMlp::backward(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                         const std::vector<int64_t>& expert_rows, ExpertScratch& scratch) const {
  const Padding p = plan_padding(scratch, expert_rows);
  if (p.pad == nullptr) {
    backward_grouped(d_in, d_out, in, saved, work, expert_rows, scratch);
    return;
  }
  float* padded_d_in = sized(scratch.d_in, p.total * width_, device_);
  backward_grouped(padded_d_in, pad(scratch.out, d_out, p), pad(scratch.in, in, p), saved, work, p.rows, scratch);
  kernels::gather_rows(device_, d_in, padded_d_in, p.unpad, nullptr, p.unpadded, width_);
}

bool ExpertMlp::bf16_interior() const {
  const LinearPrecision* first = precision_of(in_precision_, 0);  // every expert's alike
  return first != nullptr && first->takes_bf16_tensors();
}

bool ExpertMlp::bf16_hidden() const {
  const LinearPrecision* first = precision_of(in_precision_, 0);
  return !bf16_interior() && first != nullptr && first->gives_bf16_outputs();
}

void ExpertMlp::forward_grouped(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows,
                                ExpertScratch& scratch) const {
  const int64_t rows = std::accumulate(expert_rows.begin(), expert_rows.end(), int64_t{0});
  if (bf16_interior()) {
    if (rows > 0) forward_bf16(saved, out, in, expert_rows, rows, scratch);
    return;
  }
  float* act = sized(saved.act, rows * ffn_, device_);
  if (bf16_hidden()) {
    // The up projections' bf16 outputs, read by the activation as they are (one launch for all).
    void* hidden16 = sized_16bit(saved.hidden, rows * hidden_width(), device_);
    for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
      in_precision_[j]->forward(nullptr, in + at * width_, store_->value(in_[j]), nullptr, n, width_, hidden_width(),
                                false, GemmOutput::Rounded,
                                DeviceTensors{.out = at16(hidden16, at * hidden_width())});
    });
    activation_forward_bf16(device_, activation_, act, nullptr, hidden16, rows, ffn_);
  } else {
    float* hidden = sized(saved.hidden, rows * hidden_width(), device_);
    for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
      stored_linear_forward(*store_, precision_of(in_precision_, j), in_[j], hidden + at * hidden_width(),
                            in + at * width_, n, width_, hidden_width());
    });
    // One launch over every expert's rows: the activation is the same function for all of them.
    activation_forward(device_, activation_, act, hidden, rows, ffn_);
  }
  for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
    stored_linear_forward(*store_, precision_of(down_precision_, j), down_[j], out + at * width_, act + at * ffn_, n,
                          ffn_, width_);
  });
}

void ExpertMlp::backward_grouped(float* d_in, const float* d_out, const float* in, const Saved& saved,
                                 Workspace& work, const std::vector<int64_t>& expert_rows,
                                 ExpertScratch& scratch) const {
  const int64_t rows = std::accumulate(expert_rows.begin(), expert_rows.end(), int64_t{0});
  if (bf16_interior()) {
    if (rows > 0) backward_bf16(d_in, d_out, in, saved, work, expert_rows, rows, scratch);
    return;
  }
  float* d_hidden = sized(work.d_hidden, rows * hidden_width(), device_);  // written whole by the activation
  if (rows > 0) allocator(device_).zero(d_in, static_cast<size_t>(rows * width_) * sizeof(float));
  if (bf16_hidden()) {
    // Each expert's rows of the activation's gradient written whole in bf16 by its dgrad.
    void* d_act16 = sized_16bit(work.d_act, rows * ffn_, device_);
    for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
      down_precision_[j]->backward(nullptr, store_->grad(down_[j]), nullptr, d_out + at * width_,
                                   saved.act.data() + at * ffn_, store_->value(down_[j]), n, ffn_, width_,
                                   GemmOutput::Rounded, false, DeviceTensors{.din = at16(d_act16, at * ffn_)});
    });
    activation_backward_bf16(device_, activation_, d_hidden, nullptr, nullptr, d_act16, saved.hidden.data(), rows,
                             ffn_);
  } else {
    float* d_act = zeroed(work.d_act, rows * ffn_, device_);
    for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
      stored_linear_backward(*store_, precision_of(down_precision_, j), down_[j], d_act + at * ffn_,
                             d_out + at * width_, saved.act.data() + at * ffn_, n, ffn_, width_);
    });
    activation_backward(device_, activation_, d_hidden, d_act, saved.hidden.data(), rows, ffn_);
  }
  for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
    stored_linear_backward(*store_, precision_of(in_precision_, j), in_[j], d_in + at * width_,
                           d_hidden + at * hidden_width(), in + at * width_, n, width_, hidden_width());
  });
}

void ExpertMlp::forward_bf16(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows,
                             int64_t rows, ExpertScratch& scratch) const {
  void* in16 = sized_16bit(scratch.in16, rows * width_, device_);
  kernels::narrow_floats(device_, in16, in, rows * width_, DType::BF16);  // what each up projection would cast
  void* hidden = sized_16bit(saved.hidden, rows * hidden_width(), device_);
  void* act = sized_16bit(saved.act, rows * ffn_, device_);
  // Each projection's experts in one group (one grouped product on a GPU: gemm_group.h).
  GemmGroup group(device_);
  for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
    in_precision_[j]->forward(nullptr, nullptr, store_->value(in_[j]), nullptr, n, width_, hidden_width(), false,
                              GemmOutput::Rounded,
                              DeviceTensors{.in = at16(in16, at * width_), .out = at16(hidden, at * hidden_width()),
                                            .group = &group});
  });
  group.run();
  activation_forward_bf16(device_, activation_, nullptr, act, hidden, rows, ffn_);
  for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
    down_precision_[j]->forward(out + at * width_, nullptr, store_->value(down_[j]), nullptr, n, ffn_, width_, false,
                                GemmOutput::Rounded, DeviceTensors{.in = at16(act, at * ffn_), .group = &group});
  });
  group.run();
}

void ExpertMlp::backward_bf16(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                              const std::vector<int64_t>& expert_rows, int64_t rows, ExpertScratch& scratch) const {
  // The input again in bf16 (a pass, where keeping the forward's would hold it to here) and the
  // output gradient, each cast once for all experts: what every GEMM below would cast of them.
  void* in16 = sized_16bit(scratch.in16, rows * width_, device_);
  kernels::narrow_floats(device_, in16, in, rows * width_, DType::BF16);
  void* d_out16 = sized_16bit(scratch.d_out16, rows * width_, device_);
  kernels::narrow_floats(device_, d_out16, d_out, rows * width_, DType::BF16);
  void* d_act = sized_16bit(work.d_act, rows * ffn_, device_);
  void* d_hidden = sized_16bit(work.d_hidden, rows * hidden_width(), device_);
  // Each expert's rows of d_act and d_in are written whole by its dgrad: nothing is zeroed. A
  // projection's experts' dgrads and wgrads in one group: none reads what another writes.
  GemmGroup group(device_);
  for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
    down_precision_[j]->backward(
        nullptr, store_->grad(down_[j]), nullptr, nullptr, nullptr, store_->value(down_[j]), n, ffn_, width_,
        GemmOutput::Rounded, false,
        DeviceTensors{.in = at16(saved.act.data(), at * ffn_), .dout = at16(d_out16, at * width_),
                      .din = at16(d_act, at * ffn_), .group = &group});
  });
  group.run();
  activation_backward_bf16(device_, activation_, nullptr, d_hidden, nullptr, d_act, saved.hidden.data(), rows, ffn_);
  for_each_expert(expert_rows, [&](int j, int64_t at, int64_t n) {
    in_precision_[j]->backward(
        d_in + at * width_, store_->grad(in_[j]), nullptr, nullptr, nullptr, store_->value(in_[j]), n, width_,
        hidden_width(), GemmOutput::Rounded, false,
        DeviceTensors{.in = at16(in16, at * width_), .dout = at16(d_hidden, at * hidden_width()), .group = &group});
  });
  group.run();
}

}  // namespace loom::model
