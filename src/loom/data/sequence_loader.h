#pragma once
// GPT-style pre-training samples from an indexed dataset. All sequences (or those of a range:
// one part of data.split's, data/dataset_split.h), back to back, form one token stream; sample k
// is tokens [k*T, k*T + T] of it (T + 1 tokens: inputs and shifted targets).
// The order depends only on (seed, global sample index): global index g reads, in epoch
// e = g / num_samples, the sample perm_e[g % num_samples], where perm_e is a Fisher-Yates
// shuffle drawn from Philox keyed by (seed, "data.shuffle") with counter (i, e). So dp ranks that
// split a global batch read exactly what one rank would, and a resumed run continues the order.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/data/dataset_split.h"
#include "loom/data/indexed_dataset.h"

namespace loom::data {

// Permutation of [0, n) for `epoch`: Fisher-Yates where step i (from n-1 down to 1) swaps i with
// j = floor(u * (i + 1)), u taken from the 64 bits philox4x32(philox_key(seed, stream), i, epoch)
// words 0-1. Same arguments, same permutation, on every machine.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, std::string_view stream, int64_t epoch);

// Thread-safe: sample() and fill_batch() may run concurrently from many threads. The last two
// epochs' permutations are cached (a batch may straddle an epoch boundary).
class SequenceLoader {
 public:
  // Throws loom::Error when the dataset cannot be opened or holds fewer than seq_len + 1 tokens.
  SequenceLoader(const std::string& prefix, int seq_len, uint64_t seed);
  // The samples of `dataset`'s sequences `range` alone (nullopt: all); a range outside the
  // dataset, or one of fewer than seq_len + 1 tokens, is a loom::Error.
  SequenceLoader(IndexedDataset dataset, int seq_len, uint64_t seed, std::optional<SequenceRange> range);
  ~SequenceLoader();
  SequenceLoader(SequenceLoader&&) noexcept;
  SequenceLoader& operator=(SequenceLoader&&) noexcept;

  int seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  int64_t num_samples() const { return num_samples_; }  // per epoch: (the range's tokens - 1) / seq_len
  SequenceRange range() const { return range_; }
  const IndexedDataset& dataset() const { return dataset_; }

  // The sample k (its tokens start at k * seq_len) that global index g reads.
  int64_t sample_index(int64_t global_index) const;
  // Writes seq_len + 1 tokens.
  void sample(int64_t global_index, int32_t* tokens) const;
  // Row b (b < batch) is global index first_global_index + b; inputs and targets are
  // [batch, seq_len] row-major, targets[b][t] = inputs[b][t + 1] continued by the last token.
  void fill_batch(int64_t first_global_index, int batch, int32_t* inputs, int32_t* targets) const;
  // The same rows' document boundaries: documents[b][t] numbers the dataset sequences (documents,
  // as `loom data prepare` writes them, each ending with the end-of-text token) that input token t
  // of row b belongs to, 0 for the sequence the row starts in, counting up at each boundary.
  void fill_documents(int64_t first_global_index, int batch, int32_t* documents) const;

 private:
  struct Cache;
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;
  void check_index(int64_t global_index) const;

  IndexedDataset dataset_;
  int seq_len_;
  uint64_t seed_;
  SequenceRange range_;
  int64_t first_token_ = 0;  // where the range starts in the dataset's token stream
  int64_t num_samples_ = 0;
  std::unique_ptr<Cache> cache_;
};

}  // namespace loom::data
