#include "loom/data/sequence_loader.h"

#include <mutex>
#include <numeric>
#include <utility>

#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::data {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, std::string_view stream, int64_t epoch) {
  if (n < 0) throw Error("cannot permute a negative count " + std::to_string(n));
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  const uint64_t key = philox_key(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    PhiloxBlock r = philox4x32(key, static_cast<uint64_t>(i), static_cast<uint64_t>(epoch));
    uint64_t bits = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    // Multiply-shift maps 64 random bits onto [0, i]; the bias (< (i+1) / 2^64) is negligible.
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

struct SequenceLoader::Cache {
  std::mutex mutex;
  int64_t epochs[2] = {-1, -1};
  std::shared_ptr<const std::vector<int64_t>> perms[2];
  int next = 0;  // slot to replace on a miss
};

SequenceLoader::SequenceLoader(const std::string& prefix, int seq_len, uint64_t seed)
    : SequenceLoader(IndexedDataset::open(prefix), seq_len, seed, std::nullopt) {}

SequenceLoader::SequenceLoader(IndexedDataset dataset, int seq_len, uint64_t seed, std::optional<SequenceRange> range)
    : dataset_(std::move(dataset)),
      seq_len_(seq_len),
      seed_(seed),
      range_(range.value_or(SequenceRange{0, dataset_.num_sequences()})),
      cache_(std::make_unique<Cache>()) {
  const std::string& prefix = dataset_.prefix();
  const bool whole = !range.has_value();
  if (seq_len <= 0)
    throw Error("sequence length " + std::to_string(seq_len) + " for dataset '" + prefix + "' must be positive");
  const std::string sequences = "sequences [" + std::to_string(range_.begin) + ", " + std::to_string(range_.end) + ")";
  if (range_.begin < 0 || range_.begin > range_.end || range_.end > dataset_.num_sequences())
    throw Error(sequences + " are not a range of dataset '" + prefix + "''s " +
                std::to_string(dataset_.num_sequences()) + " sequences");
  first_token_ = dataset_.stream_start(range_.begin);
  const int64_t total = dataset_.stream_start(range_.end) - first_token_;
  if (total < static_cast<int64_t>(seq_len) + 1)
    throw Error("dataset '" + prefix + "'" + (whole ? " has " : "'s " + sequences + " have ") + std::to_string(total) +
                " tokens; seq_len " + std::to_string(seq_len) + " needs at least " +
                std::to_string(static_cast<int64_t>(seq_len) + 1) + " (use a shorter seq_len or more data)");
  num_samples_ = (total - 1) / seq_len;
}

SequenceLoader::~SequenceLoader() = default;
SequenceLoader::SequenceLoader(SequenceLoader&&) noexcept = default;
SequenceLoader& SequenceLoader::operator=(SequenceLoader&&) noexcept = default;

std::shared_ptr<const std::vector<int64_t>> SequenceLoader::permutation(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    for (int slot = 0; slot < 2; ++slot)
      if (cache_->epochs[slot] == epoch) return cache_->perms[slot];
  }
  // Built outside the lock so readers of the cached epoch are not held up; two threads missing
  // together both build the same permutation, and either copy is correct.
  auto perm = std::make_shared<const std::vector<int64_t>>(
      epoch_permutation(num_samples_, seed_, "data.shuffle", epoch));
  std::lock_guard<std::mutex> lock(cache_->mutex);
  for (int slot = 0; slot < 2; ++slot)
    if (cache_->epochs[slot] == epoch) return cache_->perms[slot];
  int slot = cache_->next;
  cache_->epochs[slot] = epoch;
  cache_->perms[slot] = perm;
  cache_->next = 1 - slot;
  return perm;
}

void SequenceLoader::check_index(int64_t global_index) const {
  if (global_index < 0)
    throw Error("global sample index " + std::to_string(global_index) + " for dataset '" + dataset_.prefix() +
                "' must be non-negative");
}

int64_t SequenceLoader::sample_index(int64_t global_index) const {
  check_index(global_index);
  auto perm = permutation(global_index / num_samples_);
  return (*perm)[static_cast<size_t>(global_index % num_samples_)];
}

void SequenceLoader::sample(int64_t global_index, int32_t* tokens) const {
  int64_t k = sample_index(global_index);
  dataset_.read_tokens(first_token_ + k * seq_len_, static_cast<int64_t>(seq_len_) + 1, tokens);
}

void SequenceLoader::fill_batch(int64_t first_global_index, int batch, int32_t* inputs, int32_t* targets) const {
  check_index(first_global_index);
  if (batch < 0) throw Error("batch size " + std::to_string(batch) + " must be non-negative");
  const size_t t = static_cast<size_t>(seq_len_);
  std::vector<int32_t> row(t + 1);
  std::shared_ptr<const std::vector<int64_t>> perm;
  int64_t perm_epoch = -1;
  for (int b = 0; b < batch; ++b) {
    int64_t g = first_global_index + b;
    int64_t epoch = g / num_samples_;
    if (epoch != perm_epoch) {
      perm = permutation(epoch);
      perm_epoch = epoch;
    }
    int64_t k = (*perm)[static_cast<size_t>(g % num_samples_)];
    dataset_.read_tokens(first_token_ + k * seq_len_, static_cast<int64_t>(seq_len_) + 1, row.data());
    std::copy(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(t), inputs + b * t);
    std::copy(row.begin() + 1, row.end(), targets + b * t);
  }
}

void SequenceLoader::fill_documents(int64_t first_global_index, int batch, int32_t* documents) const {
  check_index(first_global_index);
  if (batch < 0) throw Error("batch size " + std::to_string(batch) + " must be non-negative");
  for (int b = 0; b < batch; ++b) {
    const int64_t first = first_token_ + sample_index(first_global_index + b) * seq_len_;
    int64_t sequence = dataset_.sequence_holding(first);
    int64_t next = dataset_.stream_start(sequence + 1);
    int32_t id = 0;
    for (int64_t t = 0; t < seq_len_; ++t) {
      while (first + t >= next) {  // past the end of this sequence (skipping empty ones)
        ++sequence;
        ++id;
        next = dataset_.stream_start(sequence + 1);
      }
      documents[static_cast<int64_t>(b) * seq_len_ + t] = id;
    }
  }
}

}  // namespace loom::data
