// loom data prepare INPUTS... --output PREFIX [--tokenizer NAME] [--val-fraction F] [--seed S]
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"

namespace loom::cli {

void register_data(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    std::vector<std::string> inputs;
    std::string tokenizer = kDefaultTokenizer, output;
    double val_fraction = 0.02;
    uint64_t seed = 1234;
  };
  auto args = std::make_shared<Args>();
  CLI::App* data = app.add_subcommand("data", "data preparation");
  data->require_subcommand(1);
  CLI::App* cmd = data->add_subcommand("prepare", "tokenize text files into Megatron indexed datasets (.bin/.idx)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("inputs", args->inputs, "text files or directories of *.txt")->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  known_tokenizer_list() + " (the same default as data.tokenizer in a run config)");
  cmd->add_option("--output", args->output, "output prefix (writes PREFIX_train and PREFIX_val)")->required();
  cmd->add_option("--val-fraction", args->val_fraction, "fraction of documents for validation")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "seed of the train/validation split");
  commands.push_back({cmd, [args] {
                        auto tokenizer = data::make_tokenizer(args->tokenizer);
                        data::PrepareStats s =
                            data::prepare_dataset(args->inputs, *tokenizer, args->output, args->val_fraction, args->seed);
                        for (const std::string& warning : s.warnings) std::cerr << "loom data prepare: warning: " << warning << "\n";
                        std::cout << "prepared " << s.files << " files (" << s.bytes << " bytes) with "
                                  << tokenizer->name() << ": train " << s.train_documents << " documents, "
                                  << s.train_tokens << " tokens -> " << args->output << "_train.{bin,idx}; validation "
                                  << s.val_documents << " documents, " << s.val_tokens << " tokens -> " << args->output
                                  << "_val.{bin,idx}\n";
                        return 0;
                      }});
}

}  // namespace loom::cli
