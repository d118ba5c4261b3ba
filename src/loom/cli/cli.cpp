#include "loom/cli/cli.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
#include "loom/recipes/generate.h"
#include "loom/recipes/pretrain.h"
#include "loom/runtime/config.h"

namespace loom::cli {

namespace {

int train(const std::string& config_path, const std::vector<std::string>& overrides) {
  runtime::RunConfig config = runtime::load_config(config_path, overrides);
  recipes::TrainSummary summary = recipes::pretrain(config, std::cout);
  std::cout << "trained steps " << summary.first_step << ".." << summary.last_step << ": loss " << summary.first_loss
            << " -> " << summary.last_loss;
  if (summary.first_val_loss && summary.last_val_loss) {
    std::cout << ", val_loss " << *summary.first_val_loss << " -> " << *summary.last_val_loss;
  }
  std::cout << "; " << static_cast<int64_t>(summary.tokens_per_s) << " tokens/s, " << summary.gflops_per_s
            << " GFLOP/s\n";
  if (!summary.checkpoint.empty()) std::cout << "checkpoint: " << summary.checkpoint << "\n";
  return 0;
}

int prepare(const std::vector<std::string>& inputs, const std::string& tokenizer_name, const std::string& output,
            double val_fraction, uint64_t seed) {
  auto tokenizer = data::make_tokenizer(tokenizer_name);
  data::PrepareStats stats = data::prepare_dataset(inputs, *tokenizer, output, val_fraction, seed);
  std::cout << "prepared " << stats.files << " files (" << stats.bytes << " bytes) with " << tokenizer->name()
            << ": train " << stats.train_documents << " documents, " << stats.train_tokens << " tokens -> " << output
            << "_train.{bin,idx}; validation " << stats.val_documents << " documents, " << stats.val_tokens
            << " tokens -> " << output << "_val.{bin,idx}\n";
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"loom: train transformer language models on CPUs, clusters and GPUs"};
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App* train_cmd = app.add_subcommand("train", "pre-train a model: loom train CONFIG.yaml [section.key=value ...]");
  train_cmd->add_option("config", config_path, "YAML recipe")->required();
  train_cmd->add_option("overrides", overrides, "section.key=value (or ++section.key=value) overrides");

  CLI::App* data_cmd = app.add_subcommand("data", "data preparation");
  data_cmd->require_subcommand(1);
  std::vector<std::string> inputs;
  std::string tokenizer_name = "gpt2", output;
  double val_fraction = 0.02;
  uint64_t data_seed = 1234;
  CLI::App* prepare_cmd =
      data_cmd->add_subcommand("prepare", "tokenize text files into Megatron indexed datasets (.bin/.idx)");
  prepare_cmd->add_option("inputs", inputs, "text files or directories of *.txt")->required();
  prepare_cmd->add_option("--tokenizer", tokenizer_name, "byte | gpt2 | r50k_base | cl100k_base | o200k_base");
  prepare_cmd->add_option("--output", output, "output prefix (writes PREFIX_train and PREFIX_val)")->required();
  prepare_cmd->add_option("--val-fraction", val_fraction, "fraction of documents for validation")
      ->check(CLI::Range(0.0, 1.0));
  prepare_cmd->add_option("--seed", data_seed, "seed of the train/validation split");

  std::string checkpoint;
  recipes::GenerateOptions gen;
  CLI::App* generate_cmd = app.add_subcommand("generate", "generate text from a checkpoint (KV cache)");
  generate_cmd->add_option("checkpoint", checkpoint, "checkpoint directory or checkpoint root")->required();
  generate_cmd->add_option("--prompt", gen.prompt, "text to continue");
  generate_cmd->add_option("--max-tokens", gen.max_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  generate_cmd->add_option("--temperature", gen.sampling.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  generate_cmd->add_option("--top-k", gen.sampling.top_k, "keep the k most likely tokens (0 = all)")
      ->check(CLI::NonNegativeNumber);
  generate_cmd->add_option("--top-p", gen.sampling.top_p, "nucleus mass (1 = all)")->check(CLI::Range(0.0, 1.0));
  generate_cmd->add_option("--seed", gen.seed, "sampling seed");

  CLI::App* ckpt_cmd = app.add_subcommand("ckpt", "checkpoint tools");
  ckpt_cmd->require_subcommand(1);
  std::string digest_path;
  CLI::App* digest_cmd = ckpt_cmd->add_subcommand("digest", "one hex digest of the model parameters");
  digest_cmd->add_option("dir", digest_path, "checkpoint directory or checkpoint root")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train_cmd->parsed()) return train(config_path, overrides);
    if (prepare_cmd->parsed()) return prepare(inputs, tokenizer_name, output, val_fraction, data_seed);
    if (generate_cmd->parsed()) {
      std::cout << recipes::generate_text(checkpoint, gen) << std::endl;
      return 0;
    }
    if (digest_cmd->parsed()) {
      std::cout << ckpt::parameter_digest(digest_path) << std::endl;
      return 0;
    }
  } catch (const Error& e) {
    std::cerr << "loom: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "loom: unexpected error: " << e.what() << std::endl;
    return 2;
  }
  return 1;
}

}  // namespace loom::cli
