#pragma once
// AdamW: moments in fp32 laid out like the parameters, weight decay only on the pieces that ask
// for it (matrices, not norms or biases), clipping fused into the update.
//
// As an Optimizer it updates the pieces the data-parallel stages hand it and owns nothing. The
// flat form (constructed with a size and segments) owns moments for one whole buffer and steps
// it segment by segment: the one-rank reference the tests and benchmarks compare against.
#include <cstdint>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/core/tensor.h"
#include "loom/core/device.h"
#include "loom/kernels/types.h"
#include "loom/optim/optimizer.h"

namespace loom::optim {

struct Segment {
  int64_t offset = 0, numel = 0;
  bool weight_decay = true;
  float lr_scale = 1.0f;
};

class AdamW final : public Optimizer {
 public:
  // The moments live on `device`, as the parameters and gradients the updates are given.
  explicit AdamW(const config::OptimConfig& config, Device device = Device::cpu());
  // The flat form: moments for `total` elements, updated where `segments` say.
  AdamW(const config::OptimConfig& config, int64_t total, std::vector<Segment> segments, Device device = Device::cpu());

  void update(const ShardPiece& piece, const StepParams& step) const override;
  // All pieces in one adamw_update_many, each naming its step among the call's (up to
  // kMaxAdamWSteps distinct weight decays and learning-rate scales per call; on the CPU the same
  // per-piece updates as update()).
  void update_many(std::span<const ShardPiece> pieces, const StepParams& step) const override;
  bool writes_bf16_copies() const override { return true; }

  // Flat form. Updates `params` with `grads` clipped to config.clip_grad by global norm (when
  // > 0; the gradients themselves are left as they are). Returns the global norm before
  // clipping. `step` is 1-based.
  double step(float* params, const float* grads, double lr, int64_t step);
  // As step(), with the global norm computed by the caller (e.g. over tensor-parallel shards).
  void step_with_norm(float* params, const float* grads, double lr, int64_t step, double global_norm);

  float* exp_avg() { return exp_avg_.data<float>(); }
  float* exp_avg_sq() { return exp_avg_sq_.data<float>(); }
  int64_t total() const { return total_; }

 private:
  config::OptimConfig config_;
  int64_t total_ = 0;
  std::vector<Segment> segments_;
  Device device_;
  Tensor exp_avg_, exp_avg_sq_;
};

// The kernel's hyper-parameters for one update of a segment (weight decay only where it decays;
// clip_factor scales the gradients first).
kernels::AdamWStep adamw_hyper(const config::OptimConfig& config, double lr, int64_t step, bool weight_decay,
                               float clip_factor);

// Global L2 norm of grads[0..n) (on `device`).
double global_norm(const float* grads, int64_t n, Device device = Device::cpu());

}  // namespace loom::optim
