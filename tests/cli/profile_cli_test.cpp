// `loom train` under a profiler: the ranges it tells NVTX (what Nsight Systems records), heard by
// a test tool loaded the way Nsight's is (NVTX_INJECTION64_PATH, tests/support/nvtx_recorder.cpp),
// and the profiled steps' trace and summary beside them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_support.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

int count_of(const std::vector<std::string>& lines, const std::string& line) {
  int n = 0;
  for (const std::string& l : lines) n += l == line;
  return n;
}

TEST(ProfileCli, EveryRangeGoesToNvtxInLoomsDomainBalancedAndTheProfiledStepToItsTrace) {
#ifndef LOOM_TEST_NVTX_RECORDER
  GTEST_SKIP() << "this build has no NVTX headers (the CUDA toolkit's nvtx3), so loom sends no ranges to NVTX";
#else
  TempDir dir;
  CommandResult prepared = prepare_small_corpus(dir.path(), 200, 0.3);
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  write_text(dir / "config.yaml",
             "run:\n  dir: " + (dir / "run") + "\n"
             "model:\n  vocab_size: 0\n  d_model: 32\n  layers: 2\n  heads: 4\n  kv_heads: 2\n  ffn_size: 64\n"
             "  max_seq_len: 64\n"
             "data:\n  tokenizer: byte\n  train_prefix: " + (dir / "data/c_train") + "\n  seq_len: 32\n"
             "train:\n  steps: 3\n  global_batch: 4\n  micro_batch: 2\n  threads: 1\n"
             "checkpoint:\n  interval: 0\n  at_end: false\n"
             "log:\n  progress: false\n");
  const std::string record = dir / "nvtx.txt";
  const CommandResult run =
      run_loom("train " + (dir / "config.yaml") + " profile.first_step=2",
               "NVTX_INJECTION64_PATH=" + std::string(LOOM_TEST_NVTX_RECORDER) + " LOOM_NVTX_RECORD=" + record);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<std::string> lines = lines_of(record);
  ASSERT_FALSE(lines.empty()) << "the NVTX tool heard nothing";
  // Every step, not only the profiled one: a profiler attached to the process chooses what it keeps.
  for (const char* step : {"push loom step 1", "push loom step 2", "push loom step 3"})
    EXPECT_EQ(count_of(lines, step), 1) << step;
  EXPECT_EQ(count_of(lines, "push loom block 1 forward"), 3 * 2);
  EXPECT_EQ(count_of(lines, "push loom block 0 backward"), 3 * 2);
  EXPECT_EQ(count_of(lines, "push loom update"), 3);
  // Balanced: every push popped, never below zero, all in loom's domain.
  int depth = 0;
  for (const std::string& line : lines) {
    if (line.rfind("push loom ", 0) == 0) {
      ++depth;
    } else {
      EXPECT_EQ(line, "pop loom");
      --depth;
    }
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_NE(run.output.find("profile: rank 0, steps 2-2: "), std::string::npos) << run.output;
  EXPECT_TRUE(fs::exists(dir / "run/profile/rank-0.json"));
#endif
}

}  // namespace
}  // namespace loom::testing
