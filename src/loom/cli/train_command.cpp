// loom train CONFIG.yaml [section.key=value ...]
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/ops/exit_status.h"
#include "loom/train/pretrain.h"
#include "loom/config/run_config.h"

namespace loom::cli {

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
