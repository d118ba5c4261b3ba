#pragma once
// What DDP (zero 0) and ZeRO-1/2 share: the full parameter and gradient buffers stay on every
// rank, gradients are reduced bucket by bucket as the model's hooks mark them ready (during the
// last micro-batch's backward; every micro-batch's at zero 2), the tied-embedding copies are
// summed when a round ends, and compact parameters are widened around each unit.
#include <memory>

#include "loom/parallel/data/compact_parameters.h"
#include "loom/parallel/data/gradient_sync.h"
#include "loom/parallel/data/sync_setup.h"

namespace loom::parallel {

class BucketedSync : public GradientSync {
 public:
  ~BucketedSync() override;

  void begin_micro_batch(bool last) override;
  void end_micro_batch(bool last) override;
  std::string peak_memory_report() const override;
  const PipelineSyncOptions& pipeline_options() const override { return setup_.pipeline; }
  SiteTraffic last_step_traffic() const override { return last_step_; }
  bool across_sites() const override { return setup_.site != nullptr; }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 protected:
  explicit BucketedSync(SyncSetup setup);

  // Whether any lane communicates (a reduction round marks gradients ready).
  virtual bool reduces() const = 0;
  // The gradient of `local` (an index into the lane's parameters) is final for this round.
  virtual void mark_ready(int lane, int local) = 0;
  // End of a micro-batch's backward (after the tied-embedding sum): `last` of the step.
  virtual void finish_round(bool last) = 0;
  // Before a unit runs (forward, backward or recompute): its parameters must hold the last
  // update's values (ZeRO 1-2 with parallel.overlap_param_gather waits for their gathers here).
  virtual void await_parameters(int /*unit*/) {}

  // Parameters compact in `store` (precision.param_dtype=compute), widened unit by unit.
  void use_compact_parameters(std::byte* store);
  // Keeps the hooks installed for await_parameters(), every micro-batch and evaluation alike.
  void await_parameters_in_hooks();
  // Zero 2 under a schedule that does not interleave: a reduction round per micro-batch.
  bool rounds_per_micro_batch() const { return zero_ == 2 && !setup_.pipeline.reduce_once_per_step; }
  // Zeroes the full gradient buffer for the next step or round; ZeRO-2 releases its pages.
  void clear_gradients();
  std::string memory_header() const;
  // At the end of update() or skip_step(): the traffic since the previous one; `blocked_s` is the
  // total time the training thread has blocked on gradient communication so far.
  void close_step_traffic(double blocked_s);

  SyncSetup setup_;
  model::Transformer& model_;
  int zero_;
  std::vector<Lane> lanes_;
  std::vector<int> lane_of_;  // per parameter id
  std::unique_ptr<CompactParameters> compact_;

 private:
  // Hooks stay installed between micro-batches when parameters are compact (they must be
  // widened around every unit, evaluation included) or gathered while the forward runs.
  void install_hooks();
  void mark(int id);
  void reduce_tied_embedding();

  bool reducing_ = false;
  bool await_in_hooks_ = false;
  bool grads_released_ = false;  // ZeRO-2: the gradient buffer's pages went back after the last round
  SiteTraffic at_step_start_, last_step_;  // this micro-batch's backward marks gradients ready
};

}  // namespace loom::parallel
