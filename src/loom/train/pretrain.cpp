#include "loom/train/pretrain.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/indexed_dataset.h"
#include "loom/data/tokenizer.h"
#include "loom/train/batch_source.h"
#include "loom/train/blended_source.h"
#include "loom/train/run_ranks.h"

namespace loom::train {

namespace {

// Every token id of the run's datasets must fit the model's vocabulary: checked when the run
// starts, naming the dataset file and the keys that set the vocabulary.
void check_dataset_vocabulary(const config::RunConfig& config) {
  const int32_t tokenizer_vocab = is_hf_tokenizer_name(config.data.tokenizer) && config.model.vocab_size == 0
                                      ? data::make_tokenizer(config.data.tokenizer)->vocab_size()
                                      : known_tokenizer_vocab_size(config.data.tokenizer);
  const int64_t vocab = config.model.vocab_size > 0 ? config.model.vocab_size : tokenizer_vocab;
  if (vocab <= 0) return;
  std::vector<std::pair<std::string, std::string>> keyed;  // (the key that names it, prefix)
  for (const auto& [key, prefix] : {std::pair{"data.train_prefix", &config.data.train_prefix},
                                    std::pair{"data.val_prefix", &config.data.val_prefix},
                                    std::pair{"data.test_prefix", &config.data.test_prefix}}) {
    if (!prefix->empty()) keyed.emplace_back(key, *prefix);
  }
  for (const auto& [key, blend] : {std::pair{"data.train_blend", &config.data.train_blend},
                                   std::pair{"data.val_blend", &config.data.val_blend},
                                   std::pair{"data.test_blend", &config.data.test_blend}}) {
    for (size_t i = 0; i < blend->size(); ++i) {
      keyed.emplace_back(std::string(key) + "[" + std::to_string(i) + "].prefix", (*blend)[i].prefix);
    }
  }
  for (const auto& [key, prefix] : keyed) {
    std::optional<data::IndexedDataset> opened;
    try {
      opened.emplace(data::IndexedDataset::open(prefix));
    } catch (const Error& e) {
      throw Error(key + ": " + e.what());
    }
    const data::IndexedDataset& dataset = *opened;
    const std::optional<data::TokenOutOfRange> bad = dataset.find_token_at_least(vocab);
    if (!bad) continue;
    const std::string source = config.model.vocab_size > 0
                                   ? "model.vocab_size = " + std::to_string(vocab)
                                   : "model.vocab_size = 0, so data.tokenizer '" + config.data.tokenizer + "''s " +
                                         std::to_string(vocab);
    throw Error("dataset '" + data::bin_path(prefix) + "' holds token id " + std::to_string(bad->id) + " (sequence " +
                std::to_string(bad->sequence) + ", position " + std::to_string(bad->position) +
                ") but the model's vocabulary is [0, " + std::to_string(vocab) + ") (" + source +
                "); was it prepared with another tokenizer? Prepare it with `loom data prepare --tokenizer " +
                config.data.tokenizer + "`, or set data.tokenizer (and model.vocab_size) to match the dataset");
  }
}

// The samples of a dataset (`prefix`) or a blend of datasets; nullptr where neither is given.
std::unique_ptr<BatchSource> make_source(const config::RunConfig& config, const std::string& prefix,
                                         const std::string& blend_key, const std::vector<config::BlendEntry>& blend,
                                         const DatasetPart& part = {}) {
  const DocumentOptions documents = DocumentOptions::from_config(config.data);
  if (!blend.empty()) {
    return std::make_unique<BlendedSource>(blend_key, blend, config.data.seq_len, config.train.seed, documents, part);
  }
  if (prefix.empty()) return nullptr;
  return std::make_unique<PretrainingSource>(prefix, config.data.seq_len, config.train.seed, documents, part);
}

// The validation or test set: data.split's part of the training datasets (none where its share
// is 0), or the datasets named for it.
std::unique_ptr<BatchSource> held_out_source(const config::RunConfig& config, data::SplitPart part) {
  const config::DataConfig& d = config.data;
  if (d.split.on()) {
    const auto index = static_cast<size_t>(part);
    if (index >= d.split.shares.size() || d.split.shares[index] == 0.0) return nullptr;
    return make_source(config, d.train_prefix, "data.train_blend", d.train_blend, DatasetPart{d.split.shares, part});
  }
  if (part == data::SplitPart::Validation) return make_source(config, d.val_prefix, "data.val_blend", d.val_blend);
  return make_source(config, d.test_prefix, "data.test_blend", d.test_blend);
}

}  // namespace

TrainSummary pretrain(const config::RunConfig& config, std::ostream& out) {
  const auto rank = [&](comm::Communicator& world) {
    const config::DataConfig& d = config.data;
    const std::unique_ptr<BatchSource> train =
        make_source(config, d.train_prefix, "data.train_blend", d.train_blend, DatasetPart{d.split.shares});
    LOOM_CHECK(train != nullptr, "no training data: give data.train_prefix (a dataset made by `loom data prepare`) "
                                 "or data.train_blend (weighted datasets)");
    const std::unique_ptr<BatchSource> validation = held_out_source(config, data::SplitPart::Validation);
    const std::unique_ptr<BatchSource> test = held_out_source(config, data::SplitPart::Test);
    return train_rank(config, world, *train, {validation.get(), test.get()}, out);
  };
  return run_on_ranks(config, out, rank, [&] { check_dataset_vocabulary(config); });
}

}  // namespace loom::train
