// loom data prepare INPUTS... --output PREFIX [--tokenizer NAME] [--val-fraction F] [--seed S] [--json-key K]
// loom data synth --task KIND --count N --output FILE.jsonl [--seed S] [--digits D] [--numbers K] [--first I]
#include <filesystem>
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/core/tokenizer_names.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/tasks/task.h"
#include "loom/data/tokenizer.h"

namespace loom::cli {

namespace {

void register_synth(CLI::App& data, std::vector<Command>& commands) {
  struct Args {
    std::string task, output;
    int64_t count = 1000, first = 0;
    uint64_t seed = 1234;
    data::TaskOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = data.add_subcommand("synth", "write verifiable chat tasks with their answers as JSONL");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--task", args->task, "arithmetic | countdown | sorting")
      ->required()
      ->check(CLI::IsMember(data::task_kinds()));
  cmd->add_option("--count", args->count, "how many tasks")->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  cmd->add_option("--first", args->first, "index of the first task (task i depends only on seed and i)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args->seed, "seed of the tasks");
  cmd->add_option("--digits", args->options.digits, "arithmetic: digits per operand; sorting: digits per value")
      ->check(CLI::Range(1, 9));
  cmd->add_option("--numbers", args->options.numbers, "countdown: numbers given (2-8); sorting: numbers to sort")
      ->check(CLI::Range(2, 32));
  cmd->add_option("--output", args->output, "the JSONL file to write")->required();
  commands.push_back({cmd, [args] {
                        std::string text;
                        for (int64_t i = 0; i < args->count; ++i) {
                          const data::SynthTask task = data::make_task(args->task, args->seed, args->first + i, args->options);
                          text += data::task_line(task).dump() + "\n";
                        }
                        // As `data prepare` does: the output's folder is made when missing.
                        const std::filesystem::path parent = std::filesystem::path(args->output).parent_path();
                        std::error_code ec;
                        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
                        if (ec) throw loom::Error("cannot create the folder '" + parent.string() + "' for --output: " + ec.message());
                        write_file_atomic(args->output, text);
                        std::cout << "wrote " << args->count << " " << args->task << " tasks (seed " << args->seed
                                  << ", indices " << args->first << ".." << args->first + args->count - 1 << ") to "
                                  << args->output << "\n";
                        return 0;
                      }});
}

}  // namespace

void register_data(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    std::vector<std::string> inputs;
    std::string tokenizer = kDefaultTokenizer, output;
    double val_fraction = 0.02;
    uint64_t seed = 1234;
    std::string json_key = "text";
  };
  auto args = std::make_shared<Args>();
  CLI::App* data = app.add_subcommand("data", "data preparation");
  data->require_subcommand(1);
  CLI::App* cmd = data->add_subcommand(
      "prepare", "tokenize text files or JSONL corpora into Megatron indexed datasets (.bin/.idx)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("inputs", args->inputs,
                  "text files, JSON-lines files (*.jsonl, *.json, also .zst or .gz: one document per line), or "
                  "directories of them")
      ->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  known_tokenizer_list() + " (the same default as data.tokenizer in a run config)");
  cmd->add_option("--output", args->output, "output prefix (writes PREFIX_train and PREFIX_val)")->required();
  cmd->add_option("--val-fraction", args->val_fraction, "fraction of documents for validation")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "seed of the train/validation split");
  cmd->add_option("--json-key", args->json_key, "JSON lines: the key of each object's text");
  commands.push_back({cmd, [args] {
                        auto tokenizer = data::make_tokenizer(args->tokenizer);
                        data::PrepareStats s = data::prepare_dataset(args->inputs, *tokenizer, args->output,
                                                                     args->val_fraction, args->seed, args->json_key);
                        for (const std::string& warning : s.warnings) std::cerr << "loom data prepare: warning: " << warning << "\n";
                        std::cout << "prepared " << s.files << " files (" << s.bytes << " bytes) with "
                                  << tokenizer->name() << ": train " << s.train_documents << " documents, "
                                  << s.train_tokens << " tokens -> " << args->output << "_train.{bin,idx}; validation "
                                  << s.val_documents << " documents, " << s.val_tokens << " tokens -> " << args->output
                                  << "_val.{bin,idx}\n";
                        return 0;
                      }});
  register_synth(*data, commands);
}

}  // namespace loom::cli
