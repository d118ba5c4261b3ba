// loom generate CKPT --prompt TEXT [--chat [--system TEXT]] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//               [--presence-penalty P] [--frequency-penalty F] [--repetition-penalty R]
//               [--device cpu|cuda] [--dtype auto|fp32|bf16|fp16] [--speculative-config JSON]
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/data/chat/chat_format.h"
#include "loom/infer/generate.h"
#include "loom/infer/speculative.h"

namespace loom::cli {

void register_generate(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    std::string checkpoint;
    infer::GenerateOptions options;
    bool chat = false;
    std::string system;
    std::string device = "cpu";
    std::string dtype = "auto";
    std::string speculative_config;
  };
  auto args = std::make_shared<Args>();
  infer::GenerateOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a checkpoint (KV cache)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or checkpoint root")->required();
  cmd->add_option("--prompt", o.prompt, "text to continue");
  cmd->add_flag("--chat", args->chat,
               "the prompt is a user's message: render it with the checkpoint's chat template "
               "(sft.chat_template) and print the assistant's reply, up to its end of turn");
  cmd->add_option("--system", args->system, "with --chat: a system message before the user's");
  cmd->add_option("--max-tokens", o.max_tokens,
                  "tokens to generate (at most the model's context minus the prompt; a larger value is "
                  "shortened, with a note on stderr)")
      ->check(positive());
  cmd->add_option("--temperature", o.sampling.temperature, "0 = greedy")->check(finite_range(0.0, 100.0));
  cmd->add_option("--top-k", o.sampling.top_k, "keep the k most likely tokens (0 = all)")->check(non_negative());
  cmd->add_option("--top-p", o.sampling.top_p, "nucleus mass (1 = all)")->check(finite_range(0.0, 1.0));
  cmd->add_option("--presence-penalty", o.penalties.presence,
                  "subtracted from the logit of every token already generated (OpenAI's, -2 .. 2)")
      ->check(finite_range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", o.penalties.frequency,
                  "subtracted from a token's logit once per time it was generated (OpenAI's, -2 .. 2)")
      ->check(finite_range(-2.0, 2.0));
  cmd->add_option("--repetition-penalty", o.penalties.repetition,
                  "divides the positive logits (multiplies the negative ones) of tokens in the prompt or the output "
                  "(vLLM's; 1 = none)")
      ->check(number_check("a number in (0, 100]", 0.0, 100.0, true));
  cmd->add_option("--seed", o.seed, "sampling seed, 0 .. 18446744073709551615 (2^64 - 1)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "must be an integer in 0 .. 18446744073709551615, got '" + text + "'";
          },
          "UINT64"));
  cmd->add_option("--device", args->device, "where the model runs: cpu | cuda (weights and KV cache on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", args->dtype,
                  "the linear layers' GEMMs: auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16 (as loom serve's)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}));
  cmd->add_option("--speculative-config", args->speculative_config,
                  "speculative decoding, as loom serve's: '{\"method\": \"mtp\", \"num_speculative_tokens\": N}' "
                  "drafts N tokens a step with the model's multi-token prediction depths (greedy output unchanged; "
                  "docs/serving.md)");
  commands.push_back({cmd, [args] {
                        args->options.notices = &std::cerr;
                        args->options.device = args->device == "cuda" ? config::RuntimeDevice::Cuda : config::RuntimeDevice::Cpu;
                        args->options.dtype = infer::parse_inference_dtype(args->dtype);
                        if (!args->speculative_config.empty()) {
                          args->options.speculative_tokens = infer::parse_speculative_config(args->speculative_config);
                        }
                        if (!args->chat) {
                          std::cout << infer::generate_text(args->checkpoint, args->options) << std::endl;
                          return 0;
                        }
                        infer::Generator generator(args->checkpoint, args->options.device, args->options.dtype,
                                                   args->options.speculative_tokens);
                        const auto chat_template = data::make_chat_format(generator.config().sft.chat_template, generator.tokenizer());
                        nlohmann::json messages = nlohmann::json::array();
                        if (!args->system.empty()) messages.push_back({{"role", "system"}, {"content", args->system}});
                        messages.push_back({{"role", "user"}, {"content", args->options.prompt}});
                        infer::GenerateOptions options = args->options;
                        options.prompt = chat_template->render(messages, nlohmann::json::array(), true);
                        options.stop = chat_template->end_of_turn();
                        options.parse_special = true;
                        std::cout << generator.continue_text(options) << std::endl;
                        return 0;
                      }});
}

}  // namespace loom::cli
