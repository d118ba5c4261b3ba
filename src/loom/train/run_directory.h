#pragma once
// The run directory's guard, held by the process hosting rank 0 for the life of a run, so that
// nothing of an earlier run is lost and a run cannot fail at its first save:
// - a lock (run.dir/loom.lock, flock): a second trainer on the same run.dir is refused, naming
//   the process that holds it; the kernel drops the lock of a process that dies, so a stale lock
//   file never blocks a new run;
// - a fresh run (train.resume=false) into a directory holding another run's checkpoints or
//   metrics is refused with the choices (train.resume=true, another run.dir, run.overwrite=true,
//   which removes them first);
// - the checkpoint directory is created and checked writable, with room for one checkpoint,
//   before the first step.
#include <cstdint>
#include <string>

#include "loom/config/run_config.h"

namespace loom::train {

class RunDirectory {
 public:
  // Throws loom::Error naming the directory and what to do.
  explicit RunDirectory(const config::RunConfig& config);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // Throws unless the checkpoint directory's file system has `bytes` free (a checkpoint's size).
  void check_free_space(int64_t bytes) const;

 private:
  void lock();
  void refuse_takeover(const config::RunConfig& config);
  void check_checkpoint_directory();

  std::string run_dir_, checkpoint_root_;
  int lock_fd_ = -1;
};

// Bytes of one checkpoint of `model`: fp32 parameters and both Adam moments, plus the manifest.
int64_t checkpoint_bytes(const config::ModelConfig& model);

}  // namespace loom::train
