#pragma once
// The optimizer as the data-parallel stages see it: an update of the pieces of the flat buffers
// a rank owns (all of them at ZeRO 0, its shards at ZeRO 1-3), one call per piece. A piece lies
// inside one parameter segment, so it has one weight-decay setting. Clipping by the global norm
// is fused into the update as a factor on the gradients (clip_factor below).
//
// A new optimizer is one new file: a class implementing Optimizer, and its name in
// make_optimizer. The per-element state is at most two fp32 arrays laid out like the parameters
// (stored in checkpoints as optim.exp_avg.<name> / optim.exp_avg_sq.<name>).
#include <array>
#include <cstdint>
#include <memory>
#include <span>

#include "loom/config/run_config.h"
#include "loom/core/device.h"
#include "loom/kernels/types.h"

namespace loom::optim {

// One piece to update: `numel` elements from each pointer.
struct ShardPiece {
  float* param = nullptr;       // the fp32 values or master weights, updated in place
  const float* grad = nullptr;  // the reduced gradient (not scaled by the clip factor)
  std::array<float*, 2> state{};  // per-element optimizer state (AdamW: exp_avg, exp_avg_sq)
  int64_t numel = 0;
  bool weight_decay = true;
  float lr_scale = 1.0f;  // times the step's learning rate
  // Null, or where the updated values also go rounded to bf16 (2-byte elements), written by the
  // same pass where the optimizer writes_bf16_copies() (a bf16 model's copy of its weights).
  void* param_bf16 = nullptr;
  // Where the piece is a per-tensor FP8 weight whole: its amax and codes for the next step's
  // products, written by the same pass where the optimizer writes_bf16_copies() (nothing set: none).
  kernels::AdamWFp8Weight fp8{};
  // The state in host memory while param and grad are on a device (optim.cpu_offload: the stages
  // set it from where their MomentArrays put the piece's moments, optim/moment_arrays.h).
  bool state_on_host = false;
};

// What is the same for every piece of one step.
struct StepParams {
  double lr = 0.0;
  int64_t step = 1;          // 1-based
  float clip_factor = 1.0f;  // the gradients are scaled by it first
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Updates one piece; called once per piece per step (the loop over elements is inside).
  virtual void update(const ShardPiece& piece, const StepParams& step) const = 0;
  // The same for every piece of a step at once (on a GPU: as few launches as the pieces allow).
  virtual void update_many(std::span<const ShardPiece> pieces, const StepParams& step) const {
    for (const ShardPiece& piece : pieces) update(piece, step);
  }
  // Whether update() and update_many() write a piece's param_bf16 and fp8 (others leave them alone).
  virtual bool writes_bf16_copies() const { return false; }
};

// The optimizer a run's config asks for (today AdamW), offloaded to the host where
// config.cpu_offload asks for it on a GPU. `device`: where the pieces' values and gradients live.
std::unique_ptr<Optimizer> make_optimizer(const config::OptimConfig& config, Device device = Device::cpu());

// The factor gradients are scaled by to clip them to config.clip_grad (1 when no clipping is due).
// One rule for every optimizer and ZeRO stage, so every layout computes the same function.
float clip_factor(const config::OptimConfig& config, double global_norm);

}  // namespace loom::optim
