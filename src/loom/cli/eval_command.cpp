// loom eval tasks CKPT TASKS.jsonl [--limit N] [--max-tokens N] [--responses FILE.jsonl]
#include <fstream>
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/chat/chat_format.h"
#include "loom/data/chat/conversation.h"
#include "loom/data/tasks/task.h"
#include "loom/infer/generate.h"

namespace loom::cli {

namespace {

struct EvalArgs {
  std::string checkpoint, tasks, responses;
  int64_t limit = 0;
  int max_tokens = 32;
};

// Greedy replies to every task's messages before its last assistant turn, checked by the
// task's verifier; prints the exact-match accuracy.
int evaluate_tasks(const EvalArgs& args) {
  infer::Generator generator(args.checkpoint);
  const auto chat_template = data::make_chat_format(generator.config().sft.chat_template, generator.tokenizer());
  std::ifstream in(args.tasks);
  LOOM_CHECK(in.good(), "tasks file '" + args.tasks + "' cannot be read (does it exist?)");
  std::string line, log;
  int64_t number = 0, total = 0, correct = 0;
  while (std::getline(in, line) && (args.limit == 0 || total < args.limit)) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error(args.tasks + ":" + std::to_string(number) + ": not valid JSON");
    }
    LOOM_CHECK(record.is_object() && record.contains("task") && record.contains("messages") &&
                   record["messages"].is_array() && !record["messages"].empty(),
               args.tasks + ":" + std::to_string(number) + ": expected {\"messages\": [...], \"task\": {...}} as `loom data synth` writes");
    data::Conversation conversation;  // the messages checked as chat data's (docs/sft.md)
    if (auto bad = data::parse_conversation(line, conversation))
      throw Error(args.tasks + ":" + std::to_string(number) + ": " + *bad);
    nlohmann::json prompt = record["messages"];
    if (prompt.back().value("role", "") == "assistant") prompt.erase(prompt.size() - 1);
    infer::GenerateOptions options;
    options.prompt = chat_template->render(prompt, nlohmann::json::array(), true);
    options.max_tokens = args.max_tokens;
    options.sampling.temperature = 0.0;  // greedy: the reply the model ranks first
    options.stop = chat_template->end_of_turn();
    options.parse_special = true;
    const std::string reply = generator.continue_text(options);
    bool ok = false;
    try {
      ok = data::verify_response(record["task"], reply);
    } catch (const Error& e) {
      throw Error(args.tasks + ":" + std::to_string(number) + ": " + e.what());
    }
    correct += ok;
    ++total;
    // A reply need not be UTF-8 (a byte-level model may emit any byte): invalid bytes become U+FFFD.
    log += nlohmann::json{{"line", number}, {"reply", reply}, {"correct", ok}}.dump(
               -1, ' ', false, nlohmann::json::error_handler_t::replace) +
           "\n";
  }
  if (!args.responses.empty()) write_file_atomic(args.responses, log);
  LOOM_CHECK(total > 0, "tasks file '" + args.tasks + "' holds no tasks");
  std::cout << "exact match: " << correct << " / " << total << " = " << 100.0 * static_cast<double>(correct) / total
            << "%\n";
  return 0;
}

}  // namespace

void register_eval(CLI::App& app, std::vector<Command>& commands) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* eval = app.add_subcommand("eval", "evaluate a checkpoint");
  eval->require_subcommand(1);
  CLI::App* cmd = eval->add_subcommand("tasks", "exact-match accuracy on verifiable chat tasks (loom data synth)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or checkpoint root")->required();
  cmd->add_option("tasks", args->tasks, "JSONL written by loom data synth")->required();
  cmd->add_option("--limit", args->limit, "evaluate only the first N tasks (0 = all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-tokens", args->max_tokens, "most tokens per reply")->check(CLI::Range(1, 100000));
  cmd->add_option("--responses", args->responses, "write each reply and its verdict to this JSONL file");
  commands.push_back({cmd, [args] { return evaluate_tasks(*args); }});
}

}  // namespace loom::cli
