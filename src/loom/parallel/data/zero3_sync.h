#pragma once
// Zero 3: parameters, gradients and optimizer state sharded over the data-parallel group, each
// unit's parameters gathered around its use (Zero3, zero3.h). Installed as the model's hooks
// for good: a forward outside a micro-batch (evaluation) without the full parameters gathered
// is then an Error rather than a pass over released (zero) weights. One parameter group only.
#include <memory>

#include "loom/parallel/data/gradient_sync.h"
#include "loom/parallel/data/sync_setup.h"
#include "loom/parallel/data/zero3.h"

namespace loom::parallel {

class Zero3Sync final : public GradientSync {
 public:
  explicit Zero3Sync(SyncSetup setup);
  ~Zero3Sync() override;

  void begin_micro_batch(bool) override { zero3_->begin_micro_batch(); }
  void end_micro_batch(bool) override { zero3_->end_micro_batch(); }
  double step(double lr, int64_t step) override;
  std::vector<std::span<float>> reduced_gradients() override;
  void skip_step() override { zero3_->skip_step(); }
  void load_moments(const float* exp_avg, const float* exp_avg_sq) override;
  std::vector<OwnedRange> checkpoint_ranges() const override;
  void gather_full_parameters() override { zero3_->gather_full_parameters(); }
  void release_full_parameters() override { zero3_->release_full_parameters(); }
  double hidden_fraction() const override { return zero3_->hidden_fraction(); }
  MemoryBytes memory_bytes() const override;
  std::string memory_report() const override;
  std::string peak_memory_report() const override { return describe_zero3_peak(zero3_->memory()); }
  const PipelineSyncOptions& pipeline_options() const override { return setup_.pipeline; }

  void before_forward(int unit) override { zero3_->before_forward(unit); }
  void after_forward(int unit) override { zero3_->after_forward(unit); }
  void before_backward(int unit) override { zero3_->before_backward(unit); }
  void after_backward(int unit) override { zero3_->after_backward(unit); }

 private:
  SyncSetup setup_;
  std::unique_ptr<Zero3> zero3_;
};

}  // namespace loom::parallel
