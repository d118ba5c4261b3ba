#pragma once
// Zero 1 and 2: each lane's buckets are reduce-scattered over its group and this rank keeps
// master weights, moments and the reduced gradient for its shards only (DistributedOptimizer,
// distributed_optimizer.h); the updated shards are all-gathered into every rank's parameters.
// Zero 2 reduces after every micro-batch (once per step when a pipeline interleaves) and
// releases the full gradient buffer's pages between backward passes. With
// parallel.overlap_param_gather the update leaves its all-gathers in flight and each unit's
// forward waits for the buckets holding its own parameters (the model's hooks).
#include <memory>
#include <vector>

#include "loom/parallel/data/bucketed_sync.h"
#include "loom/parallel/data/distributed_optimizer.h"

namespace loom::parallel {

class ShardedSync final : public BucketedSync {
 public:
  explicit ShardedSync(SyncSetup setup);

  double gradient_norm() override;
  void update(double lr, int64_t step, double norm) override;
  std::vector<std::span<float>> reduced_gradients() override;
  void skip_step() override;
  void load_moments(const float* exp_avg, const float* exp_avg_sq) override;
  std::vector<OwnedRange> checkpoint_ranges() const override;
  double hidden_fraction() const override;
  void parameters_changed() override;
  void gather_full_parameters() override;
  double last_step_parameter_wait_s() const override { return last_step_wait_s_; }
  MemoryBytes memory_bytes() const override;
  std::string memory_report() const override;

 private:
  double blocked_seconds() const;
  bool reduces() const override { return true; }
  void mark_ready(int lane, int local) override { sharded_[lane]->mark_ready(local); }
  void finish_round(bool last) override;
  void await_parameters(int unit) override;
  // At the end of update() or skip_step(): the gathers' wait since the previous one.
  void close_step_parameter_wait();

  std::vector<std::unique_ptr<DistributedOptimizer>> sharded_;  // per lane
  // parallel.overlap_param_gather: each unit's flat ranges, whose gathers its forward awaits.
  std::vector<std::vector<FlatRange>> unit_ranges_;
  double wait_at_last_close_s_ = 0.0, last_step_wait_s_ = 0.0;
};

}  // namespace loom::parallel
