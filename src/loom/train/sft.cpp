#include "loom/train/sft.h"

#include <iomanip>
#include <memory>
#include <ostream>
#include <utility>

#include "loom/config/yaml_values.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/train/blended_source.h"
#include "loom/train/run_ranks.h"
#include "loom/train/sft_source.h"

namespace loom::train {

namespace {

// `paths`' conversations, `val_fraction` of them held out.
data::ChatDataset read_sft_dataset(const config::RunConfig& config, const std::vector<std::string>& paths,
                                   double val_fraction) {
  const config::SftConfig& sft = config.sft;
  data::ChatDatasetOptions options;
  options.paths = paths;
  options.chat_template = sft.chat_template;
  options.mask.roles = sft.train_roles;
  options.mask.last_turn_only = sft.last_turn_only;
  options.seq_len = config.data.seq_len;
  options.packing = sft.packing;
  options.val_fraction = val_fraction;
  options.seed = config.train.seed;
  options.skip_bad_lines = sft.bad_lines == config::BadLines::Skip;
  options.drop_overlong = sft.overlong == config::Overlong::Drop;
  options.split = sft.split_turns == config::SplitTurns::Never      ? data::TurnSplit::Never
                  : sft.split_turns == config::SplitTurns::Always ? data::TurnSplit::Always
                                                                  : data::TurnSplit::WhereRewritten;
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(config.data.tokenizer);
  return data::build_chat_dataset(options, *tokenizer);
}

}  // namespace

data::ChatDataset build_sft_dataset(const config::RunConfig& config, const std::vector<std::string>& paths) {
  return read_sft_dataset(config, paths, config.sft.val_fraction);
}

data::ChatDataset build_sft_dataset(const config::RunConfig& config) {
  return build_sft_dataset(config, config.sft.train_files);
}

void report_sft_dataset(const data::ChatDataset& dataset, const config::RunConfig& config, std::ostream& out,
                        const std::string& train_label) {
  for (const std::string& problem : dataset.load.problems) out << "sft: skipped " << problem << "\n";
  const auto rows = [&](const std::string& what, const data::ChatRows& r) {
    out << "sft: " << what << ": " << r.conversations << " conversations, " << r.tokens << " tokens ("
        << r.trained_tokens << " trained) in " << r.rows << " rows of " << r.seq_len << "; "
        << (config.sft.packing ? "packed" : "padded") << ", packing efficiency " << std::fixed << std::setprecision(1)
        << 100.0 * r.efficiency << "% real tokens" << std::defaultfloat << "\n";
  };
  rows(train_label, dataset.train);
  if (dataset.validation.rows > 0) rows("validation", dataset.validation);
  out << "sft: " << dataset.load.lines << " lines, " << dataset.load.problems.size() << " skipped; "
      << dataset.truncated << " conversations truncated and " << dataset.dropped_overlong
      << " dropped as longer than data.seq_len = " << config.data.seq_len << " (sft.overlong = " << config.sft.overlong
      << "); " << dataset.dropped_untrained << " without a trained token left out";
  for (size_t i = 0; i < dataset.untrained_examples.size(); ++i)
    out << (i == 0 ? " (" : ", ") << dataset.untrained_examples[i] << (i + 1 == dataset.untrained_examples.size() ? ")" : "");
  if (dataset.split_conversations > 0) {
    out << "; " << dataset.split_conversations << " split into " << dataset.split_examples
        << " examples, one per trained message (sft.split_turns = " << config.sft.split_turns << ")";
  }
  out << "\n";
}

namespace {

// The conversations of sft.val_files or sft.test_files (`key`), none held out: all in `train`.
struct HeldOutFiles {
  std::string role, key;  // "validation", "sft.val_files"
  data::ChatDataset dataset;

  HeldOutFiles(const config::RunConfig& config, std::string role_name, std::string key_name,
               const std::vector<std::string>& paths)
      : role(std::move(role_name)), key(std::move(key_name)) {
    try {
      dataset = read_sft_dataset(config, paths, 0.0);
    } catch (const Error& e) {
      throw Error(key + ": " + e.what());
    }
  }

  void report(const config::RunConfig& config, std::ostream& out) const {
    report_sft_dataset(dataset, config, out, role + " (" + key + ")");
  }

  std::unique_ptr<BatchSource> source(const config::RunConfig& config) const {
    return std::make_unique<SftSource>(dataset.train, config.train.seed, false, key);
  }
};

// What `loom sft` reads: the sft.train_files entries' conversations pooled into one dataset, or
// with sft.train_weights each entry its own dataset (split, tokenized and packed on its own),
// blended by the weights.
struct SftData {
  bool blended = false;
  std::vector<std::string> names;  // per dataset, for messages
  std::vector<data::ChatDataset> datasets;

  // sft.val_files' and sft.test_files' conversations; null where none are named.
  std::unique_ptr<HeldOutFiles> validation_files, test_files;

  explicit SftData(const config::RunConfig& config) : blended(!config.sft.train_weights.empty()) {
    if (!config.sft.val_files.empty())
      validation_files = std::make_unique<HeldOutFiles>(config, "validation", "sft.val_files", config.sft.val_files);
    if (!config.sft.test_files.empty())
      test_files = std::make_unique<HeldOutFiles>(config, "test", "sft.test_files", config.sft.test_files);
    if (!blended) {
      names.push_back("sft.train_files");
      datasets.push_back(build_sft_dataset(config));
      return;
    }
    for (size_t i = 0; i < config.sft.train_files.size(); ++i) {
      names.push_back(config.sft.train_files[i]);
      try {
        datasets.push_back(build_sft_dataset(config, {names[i]}));
      } catch (const Error& e) {
        throw Error(entry(i) + e.what());
      }
    }
  }

  // For messages: "sft.train_files[i] = '<path>': ".
  std::string entry(size_t i) const { return "sft.train_files[" + std::to_string(i) + "] = '" + names[i] + "': "; }

  void report(const config::RunConfig& config, std::ostream& out) const {
    for (size_t i = 0; i < datasets.size(); ++i) {
      if (blended) {
        out << "sft: dataset " << i << " of the blend: " << names[i] << " (weight "
            << config::detail::format_double(config.sft.train_weights[i]) << ")\n";
      }
      report_sft_dataset(datasets[i], config, out);
    }
    if (validation_files) validation_files->report(config, out);
    if (test_files) test_files->report(config, out);
  }

  // The datasets' training rows (shuffled) or validation rows (in order: sft.val_files', else the
  // held-out rows of the datasets that have any), blended when weighted; null when there are no
  // validation rows.
  std::unique_ptr<BatchSource> source(const config::RunConfig& config, bool training) const {
    if (!training && validation_files) return validation_files->source(config);
    std::vector<BlendedSource::Part> parts;
    for (size_t i = 0; i < datasets.size(); ++i) {
      const data::ChatRows& rows = training ? datasets[i].train : datasets[i].validation;
      if (rows.rows == 0 && !training) continue;
      const std::string name = names[i] + (training ? " (train split)" : " (validation split)");
      // Each dataset its own shuffle (the first one's as it would be alone).
      const uint64_t seed = config.train.seed + i * 0x9E3779B97F4A7C15ull;
      try {
        auto rows_source = std::make_unique<SftSource>(rows, seed, training, name);
        if (!blended) return rows_source;
        parts.push_back({name, config.sft.train_weights[i], std::move(rows_source)});
      } catch (const Error& e) {
        if (!blended) throw;
        throw Error(entry(i) + e.what());
      }
    }
    if (parts.empty()) return nullptr;
    return std::make_unique<BlendedSource>(std::move(parts));
  }
};

// loom sft reads its data from sft.*: a pre-training data key would go unused without a word.
void refuse_pretraining_data(const config::DataConfig& d) {
  for (const auto& [key, named] : {std::pair{"data.train_prefix", !d.train_prefix.empty()},
                                   std::pair{"data.train_blend", !d.train_blend.empty()},
                                   std::pair{"data.val_prefix", !d.val_prefix.empty()},
                                   std::pair{"data.val_blend", !d.val_blend.empty()},
                                   std::pair{"data.test_prefix", !d.test_prefix.empty()},
                                   std::pair{"data.test_blend", !d.test_blend.empty()},
                                   std::pair{"data.split", d.split.on()}}) {
    LOOM_CHECK(!named, std::string(key) + " is set, and loom sft does not read it: its conversations are "
                                          "sft.train_files, validated on sft.val_fraction of them or sft.val_files, "
                                          "tested on sft.test_files (unset " + key + ")");
  }
}

}  // namespace

TrainSummary sft(const config::RunConfig& config, std::ostream& out) {
  refuse_pretraining_data(config.data);
  const SftData data(config);
  const auto rank = [&](comm::Communicator& world) {
    if (world.rank() == 0) data.report(config, out);
    const std::unique_ptr<BatchSource> train = data.source(config, true);
    const std::unique_ptr<BatchSource> validation = data.source(config, false);
    const std::unique_ptr<BatchSource> test = data.test_files ? data.test_files->source(config) : nullptr;
    return train_rank(config, world, *train, {validation.get(), test.get()}, out);
  };
  return run_on_ranks(config, out, rank);
}

}  // namespace loom::train
