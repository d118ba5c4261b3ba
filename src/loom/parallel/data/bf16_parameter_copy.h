#pragma once
// A bf16 copy of the model's parameter values that the optimizer keeps current in its own pass:
// each update writes every value it updates rounded to bf16 beside the fp32 one
// (optim::ShardPiece::param_bf16), so a bf16 model's GEMMs multiply the copy
// (model/weight_cast_cache.h: WeightCastCache::use_bf16_copy) instead of casting every weight once
// per step, a read of its 4-byte values, a 2-byte write and a launch per weight, where the update
// adds a 2-byte write to the pass it makes anyway (Megatron and llm.c likewise keep bf16
// parameters that the optimizer writes from its fp32 master weights).
//
// Kept at ZeRO 0 (every rank updates every value) with fp32 parameters, on a device, under the
// recipes whose GEMMs take bf16 weights (bf16, and the FP8 and MX recipes' bf16 head and edge
// blocks), by an optimizer that writes copies (AdamW). Current only from an update until
// anything else writes the values (a checkpoint loaded, DiLoCo's outer step: invalidate()): the
// first update, and the first after an invalidate(), casts the whole buffer once after its pass.
// A skipped step writes nothing, so the copy stays as current as it was.
#include <cstdint>
#include <span>

#include "loom/config/run_config.h"
#include "loom/core/device.h"
#include "loom/core/tensor.h"
#include "loom/optim/optimizer.h"

namespace loom::parallel {

// Whether a run keeps the copy (the rule above, from its config): counted by the planner too.
bool keeps_bf16_parameter_copy(const config::RunConfig& config);

class Bf16ParameterCopy {
 public:
  // A copy of `values` (`total` fp32 elements on `device`), not current until the first update.
  Bf16ParameterCopy(const float* values, int64_t total, Device device);

  // Before the optimizer's pass: each piece (of the values buffer) writes its part of the copy,
  // where the copy is current; otherwise they are left alone, and after_update() casts it whole.
  void into_pieces(std::span<optim::ShardPiece> pieces);
  // After that pass: the copy holds the updated values.
  void after_update();
  // The values were written by something else.
  void invalidate() { current_ = false; }

  // The copy while current (total 2-byte elements in the values' layout), else null.
  const void* current() const { return current_ ? copy_.raw() : nullptr; }
  int64_t bytes() const { return total_ * 2; }

 private:
  const float* values_;
  int64_t total_;
  Device device_;
  Tensor copy_;
  bool current_ = false;
};

}  // namespace loom::parallel
