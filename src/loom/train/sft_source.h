#pragma once
// Supervised fine-tuning's batch source: rows of chat conversations (data/chat/chat_dataset.h)
// with their loss weights (1 on the trained roles' tokens). Global sample s reads row
// perm_e(s mod rows) of epoch e = s / rows, where perm_e is a pseudo-random permutation keyed by
// (seed, e): every epoch visits every row once, in an order that depends only on the seed, so
// every layout reads the same global batch and a resumed run continues it. Validation rows are
// read in order (no shuffle).
#include <cstdint>
#include <string>

#include "loom/data/chat/chat_dataset.h"
#include "loom/train/batch_source.h"

namespace loom::train {

class SftSource : public BlendableSource {
 public:
  // `rows` outlives the source; `shuffle`: permute rows per epoch (training) or not (validation).
  SftSource(const data::ChatRows& rows, uint64_t seed, bool shuffle, std::string name);
  void fill_rows(int64_t first, int row, int rows, TokenBatch& batch) const override;
  int64_t samples_per_epoch() const override { return rows_.rows; }
  std::string describe() const override { return name_; }
  std::string describe_reading(int64_t first, int64_t samples) const override;
  // The row global sample `sample` reads.
  int64_t row_of(int64_t sample) const;

 private:
  const data::ChatRows& rows_;
  uint64_t seed_;
  bool shuffle_;
  std::string name_;
};

// A bijection of [0, n) keyed by `key`: a 4-round Feistel network on the smallest even power of
// two >= n, walking cycles until the value falls inside [0, n).
int64_t permute_index(int64_t index, int64_t n, uint64_t key);

}  // namespace loom::train
