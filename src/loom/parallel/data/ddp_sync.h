#pragma once
// Zero 0 (DDP): every rank holds the whole model, its gradients and the optimizer state; each
// lane's buckets are all-reduced over its group during the last micro-batch's backward
// (GradReducer, grad_buckets.h), then every rank of a group runs the same update.
#include <memory>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/optim/moment_arrays.h"
#include "loom/optim/optimizer.h"
#include "loom/parallel/data/bf16_parameter_copy.h"
#include "loom/parallel/data/bucketed_sync.h"
#include "loom/parallel/data/fp8_weight_pieces.h"
#include "loom/parallel/data/grad_buckets.h"

namespace loom::parallel {

class DdpSync final : public BucketedSync {
 public:
  explicit DdpSync(SyncSetup setup);

  double gradient_norm() override;
  void update(double lr, int64_t step, double norm) override;
  std::vector<std::span<float>> reduced_gradients() override;
  void skip_step() override;
  void load_moments(const float* exp_avg, const float* exp_avg_sq) override;
  std::vector<OwnedRange> checkpoint_ranges() const override;
  double hidden_fraction() const override;
  MemoryBytes memory_bytes() const override;
  std::string memory_report() const override;
  void parameters_changed() override;
  const void* bf16_values() const override { return bf16_copy_ ? bf16_copy_->current() : nullptr; }

 private:
  double blocked_seconds() const;
  bool reduces() const override;
  void mark_ready(int lane, int local) override;
  void finish_round(bool last) override;

  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<optim::Segment> segments_;
  optim::MomentArrays moments_;  // on the parameters' device, or in part or whole on the host (optim.cpu_offload)
  Tensor master_;         // param_dtype != F32: the fp32 master weights (on the model's device)
  Tensor compact_store_;  // param_dtype != F32: the compact parameters (likewise)
  std::unique_ptr<Bf16ParameterCopy> bf16_copy_;  // keeps_bf16_parameter_copy: written by each update
  model::OptimizerWeightCasts* fp8_weights_ = nullptr;  // keeps_fp8_weight_casts: the model's, written by each update
  std::vector<std::unique_ptr<GradReducer>> reducers_;  // per lane; null over a group of one rank
};

}  // namespace loom::parallel
