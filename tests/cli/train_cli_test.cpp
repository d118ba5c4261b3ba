// End-to-end: `loom data prepare`, `loom train`, resume, `loom ckpt digest`, `loom generate`,
// and every kind of bad input giving a clear message, a non-zero exit and no damage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "cli_support.h"
#include "support/test_paths.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

// A small corpus and config: byte tokenizer, a 2-layer Llama-style model, 32-token sequences.
class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult prepared = prepare_small_corpus(dir.path(), 400, 0.3);
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
    write_text(dir / "config.yaml",
               "run:\n  dir: " + (dir / "run") + "\n"
               "model:\n  vocab_size: 0\n  d_model: 32\n  layers: 2\n  heads: 4\n  kv_heads: 2\n  ffn_size: 64\n"
               "  max_seq_len: 64\n"
               "data:\n  tokenizer: byte\n  train_prefix: " + (dir / "data/c_train") + "\n  val_prefix: " +
               (dir / "data/c_val") + "\n  seq_len: 32\n"
               "optim:\n  lr: 3.0e-3\n  warmup_steps: 2\n"
               "train:\n  steps: 8\n  global_batch: 4\n  micro_batch: 2\n  eval_interval: 4\n  eval_batches: 2\n"
               "  threads: 1\n"
               "checkpoint:\n  interval: 4\n  keep: 3\n");
  }

  CommandResult train(const std::string& overrides) { return run_loom("train " + (dir / "config.yaml") + " " + overrides); }
  std::string digest(const std::string& path) { return last_line(run_loom("ckpt digest " + path).output); }

  TempDir dir;
};

// train.exit_duration_mins (a batch job's time limit): once the time has passed, every rank stops
// after the same step with a checkpoint and exit status 0, and the run resumes from it.
TEST_F(TrainCli, ExitDurationStopsEveryRankAfterOneStepWithACheckpoint) {
  // A millionth of a minute has passed by the first step: it is the last.
  CommandResult first = train("run.dir=" + (dir / "timed") + " train.exit_duration_mins=0.000001 runtime.ranks=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("stopping after step 1 (train.exit_duration_mins = 1e-06 passed); resume with "
                              "train.resume=true"),
            std::string::npos)
      << first.output;
  EXPECT_TRUE(fs::exists(dir / "timed/checkpoints/step-00000001"));
  EXPECT_EQ(first.output.find("interrupted"), std::string::npos) << first.output;
  CommandResult rest = train("run.dir=" + (dir / "timed") + " train.resume=true runtime.ranks=2");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_TRUE(fs::exists(dir / "timed/checkpoints/step-00000008"));
  ASSERT_EQ(train("run.dir=" + (dir / "untimed") + " runtime.ranks=2").exit_code, 0);
  EXPECT_EQ(digest(dir / "timed/checkpoints"), digest(dir / "untimed/checkpoints"));
  CommandResult bad = train("run.dir=" + (dir / "bad") + " train.exit_duration_mins=-1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("train.exit_duration_mins = -1"), std::string::npos) << bad.output;
}

// More threads than the host's processors over the threads backend's ranks run slower, and the
// start says so (not where each rank has one thread, as the fixture's train.threads 1 gives).
TEST_F(TrainCli, OversubscribedThreadsAreNamed) {
  const int threads = 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CommandResult crowded = train("run.dir=" + (dir / "crowded") + " runtime.ranks=2 train.steps=1 train.threads=" +
                                std::to_string(threads));
  ASSERT_EQ(crowded.exit_code, 0) << crowded.output;
  EXPECT_NE(crowded.output.find("threads: train.threads = " + std::to_string(threads) + " gives each of the 2 ranks " +
                                std::to_string(threads / 2) + " threads, " + std::to_string(threads) +
                                " on this host's "),
            std::string::npos)
      << crowded.output;
  EXPECT_NE(crowded.output.find("oversubscribed"), std::string::npos) << crowded.output;
  CommandResult one_each = train("run.dir=" + (dir / "one-each") + " runtime.ranks=2 train.steps=1");
  ASSERT_EQ(one_each.exit_code, 0) << one_each.output;
  EXPECT_EQ(one_each.output.find("oversubscribed"), std::string::npos) << one_each.output;
}

TEST_F(TrainCli, ResumedRunIsBitwiseIdenticalToUninterrupted) {
  CommandResult full = train("run.dir=" + (dir / "full"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  CommandResult first = train("run.dir=" + (dir / "split") + " train.exit_interval=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(fs::exists(dir / "split/checkpoints/step-00000003"));
  CommandResult rest = train("run.dir=" + (dir / "split") + " ++train.resume=true");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_NE(rest.output.find("resumed from"), std::string::npos) << rest.output;

  // The same with checkpoints written in the background.
  ASSERT_EQ(train("run.dir=" + (dir / "async") + " checkpoint.async=true train.exit_interval=5").exit_code, 0);
  ASSERT_EQ(train("run.dir=" + (dir / "async") + " checkpoint.async=true train.resume=true").exit_code, 0);

  const std::string a = digest(dir / "full/checkpoints"), b = digest(dir / "split/checkpoints");
  EXPECT_EQ(a.size(), 32u) << a;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, digest(dir / "async/checkpoints"));
  // A different step's parameters differ.
  EXPECT_NE(a, digest(dir / "full/checkpoints/step-00000004"));

  // metrics.jsonl: one line per step, the resumed run appending from where it resumed.
  std::ifstream metrics(dir / "split/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    EXPECT_NE(line.find("\"step\":" + std::to_string(lines)), std::string::npos) << line;
    EXPECT_NE(line.find("\"tokens_per_s\""), std::string::npos);
  }
  EXPECT_EQ(lines, 8);
}

// train.skip_train: the command evaluates a finished run where it stopped, prints the losses its
// last step logged, exits 0 and leaves metrics.jsonl as it was.
TEST_F(TrainCli, SkipTrainPrintsTheLossesOfTheLastStep) {
  ASSERT_EQ(train("run.dir=" + (dir / "done")).exit_code, 0);
  std::ifstream metrics(dir / "done/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  const size_t at = last.find("\"val_loss\":");
  ASSERT_NE(at, std::string::npos) << last;
  char expected[64];
  std::snprintf(expected, sizeof(expected), "%f", std::stod(last.substr(at + 11)));
  CommandResult evaluated = train("run.dir=" + (dir / "done") + " train.resume=true train.skip_train=true");
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_NE(evaluated.output.find("evaluated step 8: val_loss " + std::string(expected) + " (perplexity "),
            std::string::npos)
      << evaluated.output;
  std::ifstream again(dir / "done/metrics.jsonl");
  int lines = 0;
  while (std::getline(again, line)) ++lines;
  EXPECT_EQ(lines, 8);
}

TEST_F(TrainCli, TrainingLowersValidationLossAndGenerates) {
  CommandResult run = train("train.steps=30 train.eval_interval=5");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream metrics(dir / "run/metrics.jsonl");
  std::string line;
  std::vector<double> val_losses;
  while (std::getline(metrics, line)) {
    size_t at = line.find("\"val_loss\":");
    if (at != std::string::npos) val_losses.push_back(std::stod(line.substr(at + 11)));
  }
  ASSERT_EQ(val_losses.size(), 6u) << run.output;
  EXPECT_LT(val_losses.back(), 0.8 * val_losses.front()) << "validation loss did not fall:\n" << run.output;
  CommandResult generated = run_loom("generate " + (dir / "run/checkpoints") + " --prompt 'Call me' --max-tokens 20 --temperature 0.5 --top-k 10 --top-p 0.9");
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_EQ(generated.output.rfind("Call me", 0), 0u) << generated.output;
  EXPECT_GT(generated.output.size(), std::string("Call me\n").size());
}

TEST_F(TrainCli, SimulatedTopologyCountsCrossSiteBytes) {
  CommandResult run = train("runtime.ranks=4 train.micro_batch=1 train.steps=2 topology.simulate=true topology.ranks_per_node=1 "
                            "topology.nodes_per_site=2 topology.cross_site_latency_us=100");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("cross_site"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("cross_site 0 B"), std::string::npos) << run.output;
  CommandResult refused = train("runtime.backend=mpi topology.simulate=true");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("topology.simulate"), std::string::npos) << refused.output;
}

void expect_clear_failure(const CommandResult& result, std::initializer_list<std::string> mentions) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  for (const std::string& m : mentions) EXPECT_NE(result.output.find(m), std::string::npos) << "missing '" << m << "' in:\n" << result.output;
}

TEST_F(TrainCli, BadInputsFailClearlyAndDamageNothing) {
  ASSERT_EQ(train("train.steps=4").exit_code, 0);
  const std::string checkpoint = dir / "run/checkpoints";
  const std::string before = digest(checkpoint);
  ASSERT_EQ(before.size(), 32u);

  write_text(dir / "broken.yaml", "train:\n  steps: [1, 2\n");
  expect_clear_failure(run_loom("train " + (dir / "broken.yaml")), {"broken.yaml:3", "malformed YAML"});
  expect_clear_failure(train("train.stepz=3"), {"stepz", "did you mean", "steps"});
  expect_clear_failure(train("train.steps=0"), {"train.steps", "0"});
  expect_clear_failure(train("optim.lr=-1"), {"optim.lr"});
  expect_clear_failure(run_loom("train " + (dir / "missing.yaml")), {"missing.yaml"});
  expect_clear_failure(train("data.train_prefix=" + (dir / "nowhere/c_train")), {"nowhere/c_train"});
  // A checkpoint of another model shape: the tensor and both shapes are named.
  expect_clear_failure(train("train.resume=true train.steps=8 model.d_model=48"),
                       {"model.embed_tokens.weight", "incompatible"});
  // Truncated index file.
  fs::resize_file(dir / "data/c_val.idx", 20);
  expect_clear_failure(train("train.steps=8"), {"c_val.idx"});

  EXPECT_EQ(digest(checkpoint), before);
  EXPECT_EQ(run_loom("ckpt digest " + (dir / "nowhere")).exit_code != 0, true);
}

// A model larger than the memory the process may have (its address space capped by the shell's
// ulimit): the allocator's error says what ran out, then the command that shows what the layout
// needs and the keys that make it need less; a clear exit 1, not a crash, and no checkpoint. The
// same for loom serve, with its own options.
TEST_F(TrainCli, RunningOutOfMemorySaysWhatToChange) {
  const std::string big = "model.d_model=8192 model.heads=64 model.kv_heads=8 model.ffn_size=28672 model.layers=8";
  const CommandResult r = run_loom("train " + (dir / "config.yaml") + " " + big + " run.dir=" + (dir / "big"),
                                   "ulimit -v 4000000;");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const std::string& m : {std::string("out of memory"), "loom plan memory " + (dir / "config.yaml") + " " + big,
                               std::string("train.micro_batch"), std::string("model.recompute=true"),
                               std::string("parallel.zero"), std::string("optim.cpu_offload=true"),
                               std::string("loom plan search")}) {
    EXPECT_NE(r.output.find(m), std::string::npos) << "missing '" << m << "' in:\n" << r.output;
  }
  EXPECT_TRUE(!fs::exists(dir / "big/checkpoints") || fs::is_empty(dir / "big/checkpoints")) << "a checkpoint written";

  // loom serve with a KV cache larger than the process may have: the options that make it smaller.
  ASSERT_EQ(train("train.steps=4").exit_code, 0);
  const CommandResult served =
      run_loom("serve " + (dir / "run/checkpoints") + " --port 0 --kv-cache-mb 1000000 --max-batch-tokens 64",
               "ulimit -v 4000000; timeout 120");
  EXPECT_EQ(served.exit_code, 1) << served.output;
  for (const char* m : {"out of memory", "--kv-cache-mb (now 1000000 MiB", "--tp", "--max-batch-tokens (now 64"}) {
    EXPECT_NE(served.output.find(m), std::string::npos) << "missing '" << m << "' in:\n" << served.output;
  }
}

TEST(TokenizerFiles, WrongHashIsAClearError) {
  TempDir dir;
  const std::string source = loom::test_paths::source_dir() + "/.cache/data/gpt-tokenizer/r50k_base.tiktoken";
  ASSERT_TRUE(fs::exists(source)) << "run scripts/setup.sh first: " << source << " is missing";
  fs::create_directories(dir / "gpt-tokenizer");
  fs::copy_file(source, dir / "gpt-tokenizer/r50k_base.tiktoken");
  {
    std::fstream f(dir / "gpt-tokenizer/r50k_base.tiktoken", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('#');
  }
  write_text(dir / "t.txt", "hello world\n");
  CommandResult r = run_loom("data prepare " + (dir / "t.txt") + " --tokenizer gpt2 --output " + (dir / "o"),
                             "LOOM_DATA_DIR=" + dir.path());
  expect_clear_failure(r, {"r50k_base.tiktoken", "sha256"});
  EXPECT_FALSE(fs::exists(dir / "o_train.bin"));
}

}  // namespace
}  // namespace loom::testing
