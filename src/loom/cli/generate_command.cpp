// loom generate CKPT --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/infer/generate.h"

namespace loom::cli {

void register_generate(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    std::string checkpoint;
    infer::GenerateOptions options;
  };
  auto args = std::make_shared<Args>();
  infer::GenerateOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a checkpoint (KV cache)");
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or checkpoint root")->required();
  cmd->add_option("--prompt", o.prompt, "text to continue");
  cmd->add_option("--max-tokens", o.max_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o.sampling.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", o.sampling.top_k, "keep the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o.sampling.top_p, "nucleus mass (1 = all)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o.seed, "sampling seed");
  commands.push_back({cmd, [args] {
                        std::cout << infer::generate_text(args->checkpoint, args->options) << std::endl;
                        return 0;
                      }});
}

}  // namespace loom::cli
