#pragma once
// Faults injected on purpose (the `fault` config section), to test and demonstrate recovery
// under `loom launch` (docs/operations.md):
// - kill_rank/kill_step: that rank's process sends itself SIGKILL when it reaches the step (with
//   the threads backend the whole job dies, as on a node failure);
// - stall_rank/stall_step/stall_s: that rank sleeps stall_s seconds (0 = forever) at the start of
//   the step, so the other ranks block in the step's first collective;
// - corrupt_step: once that step's checkpoint is complete, one byte of one of its shards is
//   flipped, so loading it fails its checksum and loom falls back to the previous checkpoint;
// - random_kills = N: attempts 0..N-1 (LOOM_RESTART_COUNT) each SIGKILL a rank drawn from
//   (seed, attempt) at a step 1..random_kill_window after the one the attempt starts at, so a job
//   under `loom launch --max-restarts N` dies N times at unpredictable points and still finishes.
// Faults fire only on the first attempt of a job (LOOM_RESTART_COUNT unset or 0, as `loom
// launch` sets it), so a restarted run gets past them; `fault.repeat=true` fires them always.
#include <cstdint>
#include <functional>
#include <string>

#include "loom/config/run_config.h"

namespace loom::ops {

class FaultInjector {
 public:
  // Throws loom::Error when a configured rank is not a rank of the world.
  FaultInjector(const config::FaultConfig& config, int world_rank, int world_size);

  bool armed() const { return armed_; }
  // At the start of `step`: kills this process or stalls this rank when configured.
  void at_step_start(int64_t step) const;
  // After this rank saved the checkpoint of `step` under `root`: when it is the corrupt_step,
  // waits for the save (`wait_for_save`, for background writers) and damages one shard.
  void after_checkpoint(int64_t step, const std::string& root, const std::function<void()>& wait_for_save) const;

 private:
  void kill_self(int64_t step, const std::string& why) const;

  config::FaultConfig config_;
  int rank_;
  bool armed_ = false;
  int attempt_ = 0;
  int random_kill_rank_ = -1;
  int random_kill_offset_ = 0;        // steps after the attempt's first step
  mutable int64_t first_step_ = -1;   // of this attempt: the first at_step_start
};

// Flips one byte in the middle of the first shard (by tensor name) of the checkpoint in
// `step_dir`, without touching the manifest. Returns what it did ("rank-00000.bin byte 1234
// (tensor ...)"). Throws loom::Error when the directory holds no readable checkpoint.
std::string corrupt_checkpoint_shard(const std::string& step_dir);

}  // namespace loom::ops
