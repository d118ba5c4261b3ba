#include "loom/train/sft_source.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::train {

int64_t permute_index(int64_t index, int64_t n, uint64_t key) {
  LOOM_CHECK(n > 0 && index >= 0 && index < n, "permute_index: index " + std::to_string(index) + " outside [0, " +
                                                   std::to_string(n) + ")");
  int half_bits = 1;
  while ((int64_t{1} << (2 * half_bits)) < n) ++half_bits;
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t value = static_cast<uint64_t>(index);
  do {
    uint64_t left = value >> half_bits, right = value & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t mixed = philox4x32(key, right, round)[0] & mask;
      const uint64_t next = left ^ mixed;
      left = right;
      right = next;
    }
    value = (left << half_bits) | right;
  } while (value >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(value);
}

SftSource::SftSource(const data::ChatRows& rows, uint64_t seed, bool shuffle, std::string name)
    : rows_(rows), seed_(seed), shuffle_(shuffle), name_(std::move(name)) {
  LOOM_CHECK(rows_.rows > 0, name_ + " has no conversations to read (all were held out, dropped or skipped)");
}

std::string SftSource::describe_reading(int64_t first, int64_t samples) const {
  return name_ + ": " + std::to_string(rows_.rows) + " rows of " + std::to_string(rows_.seq_len) +
         " tokens per epoch; samples [" + std::to_string(first) + ", " + std::to_string(first + samples) + ") read " +
         format_epochs(samples, rows_.rows);
}

int64_t SftSource::row_of(int64_t sample) const {
  const int64_t epoch = sample / rows_.rows, within = sample % rows_.rows;
  if (!shuffle_) return within;
  return permute_index(within, rows_.rows, philox_key(seed_ + static_cast<uint64_t>(epoch), "sft.epoch"));
}

void SftSource::fill_rows(int64_t first, int row, int rows, TokenBatch& batch) const {
  LOOM_CHECK(batch.seq == rows_.seq_len, name_ + ": a batch of " + std::to_string(batch.seq) +
                                             " tokens per sample from rows of " + std::to_string(rows_.seq_len));
  const size_t seq = static_cast<size_t>(batch.seq);
  // Packed rows carry each token's document and position (no attention across documents); a
  // padded row is one document followed by padding it never attends to: plain rows.
  if (rows_.packed) {
    batch.positions.resize(batch.inputs.size());
    batch.documents.resize(batch.inputs.size());
  }
  for (int b = 0; b < rows; ++b) {
    const size_t from = static_cast<size_t>(row_of(first + b)) * seq, to = static_cast<size_t>(row + b) * seq;
    std::copy_n(rows_.inputs.begin() + from, seq, batch.inputs.begin() + to);
    std::copy_n(rows_.targets.begin() + from, seq, batch.targets.begin() + to);
    std::copy_n(rows_.loss_weights.begin() + from, seq, batch.loss_weights.begin() + to);
    if (rows_.packed) {
      std::copy_n(rows_.positions.begin() + from, seq, batch.positions.begin() + to);
      std::copy_n(rows_.documents.begin() + from, seq, batch.documents.begin() + to);
    }
  }
}

}  // namespace loom::train
