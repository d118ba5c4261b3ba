#pragma once
// Pre-training on a weighted blend of indexed datasets (data.train_blend, data.val_blend):
// global sample g reads the dataset data::BlendIndex picks for it, at that dataset's own next
// sample index, each dataset shuffled epoch by epoch as a lone dataset is (data/sequence_loader.h,
// with the run's seed). The samples are a function of g alone, so every layout reads the same
// global batch and a resumed run continues the blend where it stopped; a blend of one dataset
// reads what data.train_prefix of it reads.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/data/blend_index.h"
#include "loom/train/batch_source.h"

namespace loom::train {

class BlendedSource : public BatchSource {
 public:
  // Throws loom::Error naming the entry (`key`[i], e.g. data.train_blend[1]) whose dataset cannot
  // be opened.
  BlendedSource(const std::string& key, const std::vector<config::BlendEntry>& entries, int seq_len, uint64_t seed,
                DocumentOptions documents);
  void fill(int64_t first, TokenBatch& batch) const override;
  std::string describe() const override;
  std::string describe_reading(int64_t first, int64_t samples) const override;

 private:
  std::vector<config::BlendEntry> entries_;
  std::vector<PretrainingSource> sources_;
  data::BlendIndex index_;
};

}  // namespace loom::train
