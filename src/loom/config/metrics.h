#pragma once
// MetricsWriter: `run_dir/metrics.jsonl`, one JSON object per line (per optimizer step: step,
// loss, lr, grad_norm, tokens_per_s, val_loss when evaluated), and with log.tensorboard the same
// numbers as TensorBoard scalars (tensorboard_events.h). Written by rank 0 only.
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "loom/config/tensorboard_events.h"

namespace loom::config {

// Rewrites a JSON-lines file atomically, keeping the lines whose integer `key` is below `end`
// (lines without one, e.g. a line torn by a crash, are dropped); nothing when it does not exist.
void keep_lines_below(const std::string& path, const std::string& key, int64_t end);

class MetricsWriter {
 public:
  // Creates `run_dir` if needed. `resume_from_step` == 0: a fresh run; an existing
  // metrics.jsonl is replaced by an empty one. > 0: a resumed run; the file keeps only the
  // lines whose integer `step` is < resume_from_step (lines without one, e.g. a line torn by
  // a crash, are dropped), so the steps redone after the checkpoint are not listed twice.
  // Both rewrites are atomic (temp file, fsync, rename). `tensorboard`: also an event file.
  MetricsWriter(const std::string& run_dir, int64_t resume_from_step, bool tensorboard = false);

  // Appends `object` (a JSON object) as one line and flushes it (and its numbers as scalars).
  void write(const nlohmann::json& object);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
  std::optional<TensorBoardWriter> tensorboard_;
};

}  // namespace loom::config
