#include "loom/ckpt/async_writer.h"

#include <chrono>
#include <iostream>

#include "loom/core/error.h"

namespace loom::ckpt {

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "loom: warning: background checkpoint save failed: " << e.what() << std::endl;
  }
}

void AsyncCheckpointWriter::save(const std::string& root, CheckpointSnapshot snapshot, int keep, const SaveRank& who) {
  wait();
  written_ = std::make_shared<CheckpointSnapshot>(std::move(snapshot));
  pending_ = std::async(std::launch::async,
                        [root, shared = written_, keep, who] { write_snapshot(root, *shared, keep, who); });
}

void AsyncCheckpointWriter::wait() {
  if (!pending_.valid()) return;
  std::future<void> done = std::move(pending_);
  done.get();
}

std::vector<std::byte> AsyncCheckpointWriter::take_arena() {
  wait();
  if (!written_) return {};
  std::vector<std::byte> arena = std::move(written_->arena);
  written_.reset();
  return arena;
}

bool AsyncCheckpointWriter::busy() const {
  return pending_.valid() && pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

}  // namespace loom::ckpt
