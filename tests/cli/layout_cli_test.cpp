// End-to-end: a parallel layout that cannot fit the world is refused before any rank exists
// when the world size is known up front (threads backend: runtime.ranks).
#include <gtest/gtest.h>

#include <chrono>

#include "cli_support.h"

namespace loom::testing {
namespace {

class LayoutCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // The dataset prefix names nothing: each rank opens its dataset first thing, so a run that
    // created ranks would fail on the dataset, not on the layout.
    write_text(dir / "config.yaml",
               "run:\n  dir: " + (dir / "run") + "\n"
               "model:\n  vocab_size: 0\n  d_model: 32\n  layers: 2\n  heads: 4\n  kv_heads: 2\n  ffn_size: 64\n"
               "  max_seq_len: 64\n"
               "data:\n  tokenizer: byte\n  train_prefix: " + (dir / "no-such-data") + "\n  seq_len: 32\n"
               "train:\n  steps: 2\n  global_batch: 4\n  micro_batch: 1\n  threads: 1\n");
  }

  // Runs `loom train` with `overrides`; returns its result and the seconds it took.
  std::pair<CommandResult, double> timed_train(const std::string& overrides) {
    const auto start = std::chrono::steady_clock::now();
    CommandResult r = run_loom("train " + (dir / "config.yaml") + " " + overrides);
    return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  }

  static bool has(const CommandResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

  TempDir dir;
};

TEST_F(LayoutCli, BatchThatDoesNotSplitOverAThousandRanksFailsBeforeAnyRankStarts) {
  auto [r, seconds] = timed_train("runtime.ranks=1000 train.global_batch=3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "train.global_batch 3 must be a multiple of train.micro_batch 1 x data-parallel ranks 1000"))
      << r.output;
  EXPECT_FALSE(has(r, "no-such-data")) << r.output;  // no rank got as far as its dataset
  EXPECT_FALSE(has(r, "run.dir")) << r.output;       // nor to the run directory
  EXPECT_LT(seconds, 1.0) << r.output;
}

TEST_F(LayoutCli, TensorAndPipelineSizesAndDataParallelSizeAreCheckedUpFront) {
  CommandResult tp = timed_train("runtime.ranks=6 parallel.tp=4").first;
  EXPECT_EQ(tp.exit_code, 1) << tp.output;
  EXPECT_TRUE(has(tp, "parallel.tp x parallel.pp = 4 x 1 does not divide the world's 6 ranks")) << tp.output;
  EXPECT_FALSE(has(tp, "no-such-data")) << tp.output;
  CommandResult dp = timed_train("runtime.ranks=4 parallel.dp=3").first;
  EXPECT_EQ(dp.exit_code, 1) << dp.output;
  EXPECT_TRUE(has(dp, "parallel.dp is 3 but the world has 4 ranks")) << dp.output;
  EXPECT_FALSE(has(dp, "no-such-data")) << dp.output;
}

TEST_F(LayoutCli, AFittingLayoutGetsPastTheCheck) {
  CommandResult r = timed_train("runtime.ranks=4 train.global_batch=8").first;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "no-such-data")) << r.output;  // the ranks started and found no dataset
}

}  // namespace
}  // namespace loom::testing
