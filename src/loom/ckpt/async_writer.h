#pragma once
// Asynchronous checkpoint saving: the caller's snapshot (tensors already copied to host buffers)
// is written by a background thread, so training continues while the disk works. At most one
// save is in flight: a new save first waits for the previous one. A failed background save is
// reported (rethrown) by the next save() or wait(); earlier checkpoints stay intact either way.
#include <future>
#include <string>

#include "loom/ckpt/checkpoint.h"

namespace loom::ckpt {

class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter() = default;
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;
  ~AsyncCheckpointWriter();  // waits; a failure is printed to stderr (destructors cannot throw)

  // Waits for the previous save (rethrowing its failure), then starts writing `snapshot`.
  void save(const std::string& root, CheckpointSnapshot snapshot, int keep, const SaveRank& who = {});
  // Blocks until no save is in flight; rethrows a failure of the last one.
  void wait();
  // Waits like wait(), then hands back the last written snapshot's memory for the next
  // snapshot_checkpoint (empty before the first save).
  std::vector<std::byte> take_arena();
  bool busy() const;

 private:
  std::future<void> pending_;
  std::shared_ptr<CheckpointSnapshot> written_;  // the snapshot being (or last) written
};

}  // namespace loom::ckpt
