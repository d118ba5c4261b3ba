// The layout invariant for data parallelism: dp ranks (threads backend) with micro-batch b train
// the same function as one rank with the whole global batch, and gradient accumulation over k
// micro-batches equals one batch k times larger. Losses per step and final parameters are
// compared (fp32: relative 1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/digest.h"
#include "loom/train/pretrain.h"
#include "loom/config/run_config.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class DataParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("dp-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Trains and returns the per-step losses; the run directory is root_/name.
  std::vector<double> train(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
        "        block_configs: [{attention: normal}, {attention: normal, kv_heads: 1, ffn_size: 40}]}\n" +
        testing::data_section(root_) +
        "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
        "train: {steps: 20, global_batch: 8, micro_batch: 8, threads: 1}\n"
        "log: {progress: false, interval: 100}\n";
    return testing::losses_of(testing::train_run(root_, name, yaml, overrides));
  }

  // Max over parameters of max|a - b| / max|a| (normwise relative difference).
  double parameter_difference(const std::string& a, const std::string& b) {
    return testing::checkpoint_difference(root_, a, b, [](const ckpt::LoadedCheckpoint& c) { return c.parameter_names(); });
  }

  void expect_same_training(const std::vector<double>& reference, const std::vector<double>& other) {
    ASSERT_EQ(reference.size(), other.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_NEAR(other[i], reference[i], 1e-5 * std::fabs(reference[i])) << "step " << i + 1;
    }
  }

  static std::string root_;
};
std::string DataParallel::root_;

// The grid: dp in {1, 2, 4} x ZeRO stage 0..3, micro-batch b = 8 / dp (and b = 2 with
// accumulation), against one rank with the whole batch of 8.
TEST_F(DataParallel, EveryLayoutComputesTheSameFunctionAsOneRank) {
  std::vector<double> one = train("reference", {});
  ASSERT_EQ(one.size(), 20u);
  EXPECT_LT(one.back(), one.front());
  for (int zero : {0, 1, 2, 3}) {
    for (int dp : {1, 2, 4}) {
      std::vector<int> micros = {8 / dp};
      if (8 / dp != 2) micros.push_back(2);  // dp 4 has micro-batches of 2 already
      for (int micro : micros) {
        if (dp == 1 && zero == 0 && micro == 8) continue;  // the reference itself
        const std::string name = "dp" + std::to_string(dp) + "-zero" + std::to_string(zero) + "-b" + std::to_string(micro);
        SCOPED_TRACE(name);
        std::vector<double> losses = train(name, {"runtime.ranks=" + std::to_string(dp), "parallel.zero=" + std::to_string(zero),
                                                  "train.micro_batch=" + std::to_string(micro), "parallel.bucket_mb=0.01"});
        expect_same_training(one, losses);
        EXPECT_LE(parameter_difference("reference", name), 1e-5);
      }
    }
  }
  // ZeRO-3 gathers a block's parameters again for its recompute (activation checkpointing).
  std::vector<double> recomputed = train("dp2-zero3-recompute", {"runtime.ranks=2", "parallel.zero=3", "train.micro_batch=2",
                                                                "model.recompute=true"});
  expect_same_training(one, recomputed);
  EXPECT_LE(parameter_difference("reference", "dp2-zero3-recompute"), 1e-5);
}

// Sharded optimizer state survives a checkpoint: stopping and resuming at the same layout is
// bitwise identical to an uninterrupted run.
TEST_F(DataParallel, ShardedOptimizerStateResumesBitwise) {
  for (int zero : {1, 2, 3}) {
    const std::string layout = "runtime.ranks=2", stage = "parallel.zero=" + std::to_string(zero);
    const std::string full = "resume-full-" + std::to_string(zero), split = "resume-split-" + std::to_string(zero);
    train(full, {layout, stage, "train.micro_batch=2", "parallel.bucket_mb=0.01"});
    train(split, {layout, stage, "train.micro_batch=2", "parallel.bucket_mb=0.01", "train.exit_interval=7"});
    train(split, {layout, stage, "train.micro_batch=2", "parallel.bucket_mb=0.01", "train.resume=true"});
    EXPECT_EQ(ckpt::parameter_digest(root_ + "/" + full + "/checkpoints"),
              ckpt::parameter_digest(root_ + "/" + split + "/checkpoints"))
        << "zero " << zero;
  }
}

TEST_F(DataParallel, GradientAccumulationEqualsOneLargerBatch) {
  std::vector<double> one = train("accumulate-1", {});
  std::vector<double> four = train("accumulate-4", {"train.micro_batch=2"});
  expect_same_training(one, four);
  EXPECT_LE(parameter_difference("accumulate-1", "accumulate-4"), 1e-5);
}

TEST_F(DataParallel, LayoutErrorsNameTheKeys) {
  EXPECT_THROW(train("bad-dp", {"runtime.ranks=2", "parallel.dp=3"}), Error);
  try {
    train("bad-batch", {"runtime.ranks=3", "train.micro_batch=1"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.global_batch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::train
