// loom train CONFIG.yaml [section.key=value ...]
// loom sft CONFIG.yaml [section.key=value ...]
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/cli/memory_advice.h"
#include "loom/cli/training_report.h"
#include "loom/config/run_config.h"
#include "loom/core/tokenizer_names.h"
#include "loom/train/pretrain.h"
#include "loom/train/sft.h"

namespace loom::cli {

namespace {

using Recipe = train::TrainSummary (*)(const config::RunConfig&, std::ostream&);

void register_recipe(CLI::App& app, std::vector<Command>& commands, const std::string& verb,
                     const std::string& description, Recipe recipe) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(verb, description + ": loom " + verb + " CONFIG.yaml [section.key=value ...]");
  cmd->add_option("config", args->config, "YAML recipe")->required();
  cmd->add_option("overrides", args->overrides,
                  "section.key=value (or ++section.key=value) overrides, e.g. data.tokenizer=gpt2 (default: " +
                      std::string(kDefaultTokenizer) + "; one of " + known_tokenizer_list(", ") + ")");
  commands.push_back({cmd, [args, recipe] {
                        const config::RunConfig config = config::load_config(args->config, args->overrides);
                        return with_memory_advice(training_memory_advice(args->config, args->overrides), [&] {
                          return report_training(recipe(config, std::cout));
                        });
                      }});
}

}  // namespace

void register_train(CLI::App& app, std::vector<Command>& commands) {
  register_recipe(app, commands, "train", "pre-train a model", &train::pretrain);
  register_recipe(app, commands, "sft", "fine-tune a model on chat conversations (sft.* keys, docs/sft.md)",
                  &train::sft);
}

}  // namespace loom::cli
