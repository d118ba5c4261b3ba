// loom train CONFIG.yaml [section.key=value ...]
#include <iostream>
#include <memory>
#include <optional>

#include "loom/cli/command.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/indexed_dataset.h"
#include "loom/ops/exit_status.h"
#include "loom/train/pretrain.h"
#include "loom/config/run_config.h"

namespace loom::cli {

namespace {

// Every token id of the run's datasets must fit the model's vocabulary: checked when the run
// starts, naming the dataset file and the keys that set the vocabulary.
void check_dataset_vocabulary(const config::RunConfig& config) {
  const int32_t tokenizer_vocab = known_tokenizer_vocab_size(config.data.tokenizer);
  const int64_t vocab = config.model.vocab_size > 0 ? config.model.vocab_size : tokenizer_vocab;
  if (vocab <= 0) return;
  for (const std::string& prefix : {config.data.train_prefix, config.data.val_prefix}) {
    if (prefix.empty()) continue;
    const data::IndexedDataset dataset = data::IndexedDataset::open(prefix);
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

}  // namespace

void register_train(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "pre-train a model: loom train CONFIG.yaml [section.key=value ...]");
  cmd->add_option("config", args->config, "YAML recipe")->required();
  cmd->add_option("overrides", args->overrides,
                  "section.key=value (or ++section.key=value) overrides, e.g. data.tokenizer=gpt2 (default: " +
                      std::string(kDefaultTokenizer) + "; one of " + known_tokenizer_list(", ") + ")");
  commands.push_back({cmd, [args] {
                        config::RunConfig config = config::load_config(args->config, args->overrides);
                        check_dataset_vocabulary(config);
                        train::TrainSummary s = train::pretrain(config, std::cout);
                        if (!s.reporter) return ops::kExitFinished;  // another process (MPI rank 0) reports
                        if (s.steps_run == 0) return ops::kExitFinished;  // already complete: restore() said so
                        std::cout << "trained steps " << s.first_step << ".." << s.last_step << ": loss "
                                  << s.first_loss << " -> " << s.last_loss;
                        if (s.first_val_loss && s.last_val_loss) {
                          std::cout << ", val_loss " << *s.first_val_loss << " -> " << *s.last_val_loss;
                        }
                        std::cout << "; " << static_cast<int64_t>(s.tokens_per_s) << " tokens/s, " << s.gflops_per_s
                                  << " GFLOP/s\n";
                        if (!s.checkpoint.empty()) std::cout << "checkpoint: " << s.checkpoint << "\n";
                        if (s.stop_signal != 0) {
                          std::cout << "interrupted at step " << s.last_step << " of " << config.train.steps
                                    << "; continue with train.resume=true\n";
                          return ops::exit_status_interrupted(s.stop_signal);
                        }
                        return ops::kExitFinished;
                      }});
}

}  // namespace loom::cli
