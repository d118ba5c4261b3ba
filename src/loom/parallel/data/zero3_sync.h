#pragma once
// Zero 3: parameters, gradients and optimizer state sharded over the data-parallel group, each
// unit's parameters gathered around its use (Zero3, zero3.h). Installed as the model's hooks
// for good: a forward outside a micro-batch (evaluation) without the full parameters gathered
// is then an Error rather than a pass over released (zero) weights. One Zero3 per parameter
// group (expert parallelism: dense parameters over dp, experts over expert-dp), each over its
// own parameters, whose part of every unit must be one contiguous range.
#include <memory>

#include "loom/parallel/data/gradient_sync.h"
#include "loom/parallel/data/sync_setup.h"
#include "loom/parallel/data/zero3.h"

namespace loom::parallel {

class Zero3Sync final : public GradientSync {
 public:
  explicit Zero3Sync(SyncSetup setup);
  ~Zero3Sync() override;

  void begin_micro_batch(bool) override;
  void end_micro_batch(bool) override;
  double gradient_norm() override;
  void update(double lr, int64_t step, double norm) override;
  std::vector<std::span<float>> reduced_gradients() override;
  bool reduced_gradients_on_host() const override;
  void skip_step() override;
  void load_moments(const float* exp_avg, const float* exp_avg_sq) override;
  std::vector<OwnedRange> checkpoint_ranges() const override;
  void gather_full_parameters() override;
  void release_full_parameters() override;
  double hidden_fraction() const override;
  MemoryBytes memory_bytes() const override;
  std::string memory_report() const override;
  std::string peak_memory_report() const override;
  const PipelineSyncOptions& pipeline_options() const override { return setup_.pipeline; }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  Zero3Memory memory() const;  // summed over the groups

  SyncSetup setup_;
  std::vector<std::unique_ptr<Zero3>> zero3_;  // per parameter group
};

}  // namespace loom::parallel
