#include "loom/train/blended_source.h"

#include <cstdio>

#include "loom/config/yaml_values.h"
#include "loom/core/error.h"

namespace loom::train {

namespace {

std::vector<double> weights_of(const std::vector<BlendedSource::Part>& parts) {
  std::vector<double> weights;
  for (const BlendedSource::Part& part : parts) weights.push_back(part.weight);
  return weights;
}

std::vector<BlendedSource::Part> dataset_parts(const std::string& key, const std::vector<config::BlendEntry>& entries,
                                               int seq_len, uint64_t seed, DocumentOptions documents,
                                               const DatasetPart& part) {
  std::vector<BlendedSource::Part> parts;
  for (size_t i = 0; i < entries.size(); ++i) {
    try {
      auto source = std::make_unique<PretrainingSource>(entries[i].prefix, seq_len, seed, documents, part);
      std::string name = source->describe();  // the prefix, and which sequences of a split
      parts.push_back({std::move(name), entries[i].weight, std::move(source)});
    } catch (const Error& e) {
      throw Error(key + "[" + std::to_string(i) + "].prefix = '" + entries[i].prefix + "': " + e.what());
    }
  }
  return parts;
}

}  // namespace

BlendedSource::BlendedSource(std::vector<Part> parts) : parts_(std::move(parts)), index_(weights_of(parts_)) {}

BlendedSource::BlendedSource(const std::string& key, const std::vector<config::BlendEntry>& entries, int seq_len,
                             uint64_t seed, DocumentOptions documents, const DatasetPart& part)
    : BlendedSource(dataset_parts(key, entries, seq_len, seed, documents, part)) {}

void BlendedSource::fill(int64_t first, TokenBatch& batch) const {
  const std::vector<data::BlendIndex::Pick> picks = index_.picks(first, batch.batch);
  for (int r = 0; r < batch.batch; ++r) {
    const data::BlendIndex::Pick& pick = picks[static_cast<size_t>(r)];
    parts_[static_cast<size_t>(pick.dataset)].source->fill_rows(pick.sample, r, 1, batch);
  }
}

std::string BlendedSource::describe() const {
  std::string text = "blend of";
  for (size_t i = 0; i < parts_.size(); ++i) {
    const std::string weight = config::detail::format_double(parts_[i].weight);
    text += (i == 0 ? " " : ", ") + parts_[i].name + " (weight " + weight + ")";
  }
  return text;
}

std::string BlendedSource::describe_reading(int64_t first, int64_t samples) const {
  const std::vector<int64_t> before = index_.counts_before(first), after = index_.counts_before(first + samples);
  std::string text = "blend of " + std::to_string(parts_.size()) + " datasets; samples [" + std::to_string(first) +
                     ", " + std::to_string(first + samples) + ") read";
  for (size_t i = 0; i < parts_.size(); ++i) {
    const int64_t reads = after[i] - before[i], per_epoch = parts_[i].source->samples_per_epoch();
    char share[32];
    std::snprintf(share, sizeof share, "%.1f%%", samples > 0 ? 100.0 * static_cast<double>(reads) / samples : 0.0);
    text += std::string(i == 0 ? " " : ", ") + parts_[i].name + " " + share + " (" + std::to_string(reads) +
            " samples: " + format_epochs(reads, per_epoch) + " of its " + std::to_string(per_epoch) + ")";
  }
  return text;
}

}  // namespace loom::train
