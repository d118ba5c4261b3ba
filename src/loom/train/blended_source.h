#pragma once
// A weighted blend of sources (pre-training's data.train_blend / data.val_blend of indexed
// datasets, SFT's sft.train_weights over its files): global sample g reads the source
// data::BlendIndex picks for it, at that source's own next sample index, each source shuffled
// epoch by epoch as it is alone (a dataset: data/sequence_loader.h; a conversation file:
// sft_source.h). The samples are a function of g alone, so every layout reads the same global
// batch and a resumed run continues the blend where it stopped; a blend of one source reads what
// that source alone reads.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/data/blend_index.h"
#include "loom/train/batch_source.h"

namespace loom::train {

class BlendedSource : public BatchSource {
 public:
  struct Part {
    std::string name;   // for messages: the dataset's prefix, the file's path
    double weight = 1;  // relative to the other parts' weights
    std::unique_ptr<BlendableSource> source;
  };
  explicit BlendedSource(std::vector<Part> parts);
  // Pre-training's blend of indexed datasets (each one's `part` of data.split when it splits);
  // throws loom::Error naming the entry (`key`[i], e.g. data.train_blend[1]) whose dataset
  // cannot be opened.
  BlendedSource(const std::string& key, const std::vector<config::BlendEntry>& entries, int seq_len, uint64_t seed,
                DocumentOptions documents, const DatasetPart& part = {});
  void fill(int64_t first, TokenBatch& batch) const override;
  std::string describe() const override;
  std::string describe_reading(int64_t first, int64_t samples) const override;

 private:
  std::vector<Part> parts_;
  data::BlendIndex index_;
};

}  // namespace loom::train
