#pragma once
// The trainer's handle on gradient synchronisation: owns the implementation make_gradient_sync()
// picks for parallel.zero (gradient_sync.h) and forwards to it, so callers hold one object by
// value whatever the stage.
#include <memory>

#include "loom/parallel/data/gradient_sync.h"

namespace loom::parallel {

class DataParallelStep final : public GradientSync {
 public:
  // `dp`: the ranks holding the same shard of the model. `pp`: the pipeline group when the
  // model is a pipeline stage (the norm sums over the stages; ZeRO 0-2 only), with what the
  // stage's schedule needs (pipeline_sync_options in parallel/pipeline/pipeline_step.h).
  DataParallelStep(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                   comm::Communicator* pp = nullptr, PipelineSyncOptions pipeline = {});
  DataParallelStep(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                   GradientSyncOptions options);

  void begin_micro_batch(bool last) override { sync_->begin_micro_batch(last); }
  void end_micro_batch(bool last) override { sync_->end_micro_batch(last); }
  double gradient_norm() override { return sync_->gradient_norm(); }
  void update(double lr, int64_t step, double norm) override { sync_->update(lr, step, norm); }
  std::vector<std::span<float>> reduced_gradients() override { return sync_->reduced_gradients(); }
  bool reduced_gradients_on_host() const override { return sync_->reduced_gradients_on_host(); }
  void skip_step() override { sync_->skip_step(); }
  void load_moments(const float* exp_avg, const float* exp_avg_sq) override {
    sync_->load_moments(exp_avg, exp_avg_sq);
  }
  std::vector<OwnedRange> checkpoint_ranges() const override { return sync_->checkpoint_ranges(); }
  void gather_full_parameters() override { sync_->gather_full_parameters(); }
  void release_full_parameters() override { sync_->release_full_parameters(); }
  double hidden_fraction() const override { return sync_->hidden_fraction(); }
  MemoryBytes memory_bytes() const override { return sync_->memory_bytes(); }
  std::string memory_report() const override { return sync_->memory_report(); }
  std::string peak_memory_report() const override { return sync_->peak_memory_report(); }
  const PipelineSyncOptions& pipeline_options() const override { return sync_->pipeline_options(); }
  SiteTraffic last_step_traffic() const override { return sync_->last_step_traffic(); }
  double last_step_parameter_wait_s() const override { return sync_->last_step_parameter_wait_s(); }
  bool across_sites() const override { return sync_->across_sites(); }
  void parameters_changed() override { sync_->parameters_changed(); }
  const void* bf16_values() const override { return sync_->bf16_values(); }

  GradientSync& sync() { return *sync_; }

 private:
  std::unique_ptr<GradientSync> sync_;  // installs itself as the model's hooks
};

}  // namespace loom::parallel
