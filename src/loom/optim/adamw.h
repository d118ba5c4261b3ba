#pragma once
// AdamW over a flat parameter buffer: moments in fp32 laid out like the parameters, weight
// decay only on the segments that ask for it (matrices, not norms or biases), global-norm
// gradient clipping before the update.
#include <cstdint>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/core/device.h"
#include "loom/kernels/types.h"
#include "loom/config/run_config.h"

namespace loom::optim {

struct Segment {
  int64_t offset = 0, numel = 0;
  bool weight_decay = true;
};

class AdamW {
 public:
  // The moments live on `device`, as the parameters and gradients the steps are given.
  AdamW(const config::OptimConfig& config, int64_t total, std::vector<Segment> segments, Device device = Device::cpu());

  // Updates `params` with `grads` clipped to config.clip_grad by global norm (when > 0; the
  // gradients themselves are left as they are). Returns the global norm before clipping.
  // `step` is 1-based.
  double step(float* params, const float* grads, double lr, int64_t step);
  // As step(), with the global norm computed by the caller (e.g. over tensor-parallel shards).
  void step_with_norm(float* params, const float* grads, double lr, int64_t step, double global_norm);

  float* exp_avg() { return exp_avg_.data<float>(); }
  float* exp_avg_sq() { return exp_avg_sq_.data<float>(); }
  int64_t total() const { return total_; }

 private:
  config::OptimConfig config_;
  int64_t total_;
  std::vector<Segment> segments_;
  Device device_;
  Tensor exp_avg_, exp_avg_sq_;
};

// The kernel's hyper-parameters for one update of a segment (weight decay only where it decays;
// clip_factor scales the gradients first).
kernels::AdamWStep adamw_hyper(const config::OptimConfig& config, double lr, int64_t step, bool weight_decay,
                               float clip_factor);

// The factor gradients are scaled by to clip them to config.clip_grad (1 when no clipping is due).
// One rule for every optimizer, sharded or not, so every layout computes the same function.
float clip_factor(const config::OptimConfig& config, double global_norm);

// Global L2 norm of grads[0..n) (on `device`).
double global_norm(const float* grads, int64_t n, Device device = Device::cpu());

}  // namespace loom::optim
