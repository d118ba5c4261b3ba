// End-to-end: `loom data synth` writes deterministic verifiable tasks; `loom sft` fine-tunes a
// pre-trained checkpoint on them (train.init_from), reports the dataset, evaluates held-out
// conversations, resumes; `loom eval tasks` and `loom generate --chat` read the result; bad
// chat data is named by file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "support/test_paths.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class SftCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult synth = run_loom("data synth --task arithmetic --digits 2 --count 64 --output " + (dir / "a.jsonl"));
    ASSERT_EQ(synth.exit_code, 0) << synth.output;
    const std::string model =
        "model:\n  vocab_size: 0\n  d_model: 32\n  layers: 2\n  heads: 4\n  kv_heads: 2\n  ffn_size: 64\n  max_seq_len: 128\n";
    write_text(dir / "sft.yaml", "run:\n  dir: " + (dir / "run") + "\n" + model +
                                     "data:\n  tokenizer: byte\n  seq_len: 128\n"
                                     "sft:\n  train_files: [" + (dir / "a.jsonl") + "]\n  val_fraction: 0.25\n"
                                     "optim:\n  lr: 3.0e-3\n  warmup_steps: 1\n"
                                     "train:\n  steps: 4\n  global_batch: 4\n  micro_batch: 2\n  eval_interval: 2\n"
                                     "  eval_batches: 1\n  threads: 1\n"
                                     "checkpoint:\n  interval: 2\n");
  }
  CommandResult sft(const std::string& overrides) { return run_loom("sft " + (dir / "sft.yaml") + " " + overrides); }

  TempDir dir;
};

TEST_F(SftCli, SynthIsDeterministicBySeed) {
  ASSERT_EQ(run_loom("data synth --task arithmetic --digits 2 --count 64 --output " + (dir / "b.jsonl")).exit_code, 0);
  EXPECT_EQ(read_text(dir / "a.jsonl"), read_text(dir / "b.jsonl"));
  ASSERT_EQ(run_loom("data synth --task countdown --count 5 --seed 9 --output " + (dir / "c.jsonl")).exit_code, 0);
  EXPECT_NE(read_text(dir / "c.jsonl").find("\"kind\":\"countdown\""), std::string::npos);
  CommandResult bad = run_loom("data synth --task chess --count 5 --output " + (dir / "d.jsonl"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("chess"), std::string::npos) << bad.output;
}

TEST_F(SftCli, FineTunesResumesAndEvaluates) {
  CommandResult first = sft("train.exit_interval=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("sft: train: "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("packing efficiency"), std::string::npos) << first.output;
  CommandResult second = sft("train.resume=true");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("val_loss"), std::string::npos) << second.output;
  // Fine-tuning from it: weights only, a fresh optimizer and step 0.
  CommandResult tuned = sft("run.dir=" + (dir / "tuned") + " train.steps=2 train.init_from=" + (dir / "run/checkpoints"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("train.init_from: parameters of"), std::string::npos) << tuned.output;
  CommandResult eval = run_loom("eval tasks " + (dir / "tuned/checkpoints") + " " + (dir / "a.jsonl") +
                                " --limit 3 --max-tokens 4 --responses " + (dir / "r.jsonl"));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("exact match: "), std::string::npos) << eval.output;
  EXPECT_NE(eval.output.find(" / 3 = "), std::string::npos) << eval.output;
  // The replies are greedy: each equals `loom generate --chat --temperature 0` of its question
  // (compared with invalid UTF-8 replaced, as the responses file writes them).
  std::ifstream tasks(dir / "a.jsonl"), replies(dir / "r.jsonl");
  std::string task_line, reply_line;
  for (int i = 0; i < 3 && std::getline(tasks, task_line) && std::getline(replies, reply_line); ++i) {
    const std::string question = nlohmann::json::parse(task_line)["messages"][0]["content"];
    CommandResult greedy = run_loom("generate " + (dir / "tuned/checkpoints") + " --chat --temperature 0 --max-tokens 4 --prompt '" +
                                    question + "'");
    ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
    ASSERT_FALSE(greedy.output.empty());
    greedy.output.pop_back();  // generate's newline
    const std::string printed = nlohmann::json::parse(
        nlohmann::json(greedy.output).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)).get<std::string>();
    EXPECT_EQ(nlohmann::json::parse(reply_line)["reply"].get<std::string>(), printed) << question;
  }
  CommandResult chat = run_loom("generate " + (dir / "tuned/checkpoints") + " --chat --prompt 'What is 2 + 2?' --max-tokens 4");
  EXPECT_EQ(chat.exit_code, 0) << chat.output;
  EXPECT_EQ(chat.output.find("<|im_start|>"), std::string::npos) << "only the reply is printed: " << chat.output;
}

// A Hugging Face tokenizer with its own chat template (Llama 3's, which appends the assistant's
// header to every rendering): the conversations are attributed, trained and generated from.
TEST_F(SftCli, FineTunesWithAHuggingFaceTokenizerAndItsTemplate) {
  const std::string llama3 = loom::test_paths::data_dir() + "/hf/llama3";
  ASSERT_TRUE(fs::is_regular_file(llama3 + "/tokenizer_config.json")) << llama3 << " missing; run scripts/setup.sh";
  CommandResult tuned = sft("run.dir=" + (dir / "hf") + " data.tokenizer=hf:" + llama3 +
                            " sft.chat_template=tokenizer train.steps=2 train.eval_interval=0 checkpoint.interval=0");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("sft: train: 4"), std::string::npos) << "every conversation kept: " << tuned.output;
  EXPECT_NE(tuned.output.find("0 skipped"), std::string::npos) << tuned.output;
  CommandResult chat = run_loom("generate " + (dir / "hf/checkpoints") + " --chat --prompt 'What is 2 + 2?' --max-tokens 3");
  EXPECT_EQ(chat.exit_code, 0) << chat.output;
  EXPECT_EQ(chat.output.find("<|start_header_id|>"), std::string::npos) << "only the reply is printed: " << chat.output;
}

TEST_F(SftCli, BadChatDataIsNamedByFileAndLine) {
  std::ofstream(dir / "a.jsonl", std::ios::app) << "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n";
  CommandResult failed = sft("");
  EXPECT_EQ(failed.exit_code, 1);
  EXPECT_NE(failed.output.find(dir / "a.jsonl" + ":65: messages[0].role = \"robot\""), std::string::npos)
      << failed.output;
  CommandResult skipped = sft("sft.bad_lines=skip");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("sft: skipped " + dir / "a.jsonl" + ":65:"), std::string::npos) << skipped.output;
  CommandResult role = sft("sft.train_roles=[assistant,robot]");
  EXPECT_EQ(role.exit_code, 1);
  EXPECT_NE(role.output.find("sft.train_roles"), std::string::npos) << role.output;
}

TEST_F(SftCli, EvalTasksNamesABadLineByFileAndLine) {
  CommandResult tuned = sft("train.steps=1 train.eval_interval=0 checkpoint.interval=0");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": [5], "task": {"kind": "arithmetic"}})", ":1: messages[0] must be an object"},
      {R"({"messages": [{"role": 5, "content": "q"}], "task": {"kind": "arithmetic"}})",
       ":1: messages[0].role must be a string"},
      {R"({"messages": [{"role": "user", "content": "q"}], "task": {"kind": "arithmetic"}})",
       ":1: this arithmetic task is missing a field"},
  };
  for (const auto& [line, expected] : cases) {
    write_text(dir / "bad.jsonl", std::string(line) + "\n");
    CommandResult eval =
        run_loom("eval tasks " + (dir / "run/checkpoints") + " " + (dir / "bad.jsonl") + " --max-tokens 2");
    EXPECT_EQ(eval.exit_code, 1) << eval.output;
    EXPECT_NE(eval.output.find(dir / "bad.jsonl" + expected), std::string::npos) << eval.output;
  }
}

}  // namespace
}  // namespace loom::testing
