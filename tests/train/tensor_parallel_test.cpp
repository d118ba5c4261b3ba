// The layout invariant for tensor parallelism: tp ranks (threads backend), with and without
// sequence parallelism, composed with data parallelism and ZeRO-1, train the same function as
// one rank for 20 steps (losses per step and final parameters, fp32: relative 1e-5), on a
// GPT-2-style and a heterogeneous Llama-style (GQA) model; a checkpoint written at tp = 2
// continues at tp = 1 and tp = 4 with the same losses.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/ckpt/checkpoint.h"
#include "loom/train/pretrain.h"
#include "loom/config/run_config.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

const char* kGpt2Style =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, max_seq_len: 32, norm: layer,\n"
    "        activation: gelu, positions: learned, bias: true}\n";
const char* kLlamaHetero =
    "model: {vocab_size: 0, d_model: 32, layers: 3, heads: 8, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        tied_embeddings: false,\n"
    "        block_configs: [{attention: normal}, {attention: skip, ffn_size: 32}, {kv_heads: 4, ffn_size: 0}]}\n";

class TensorParallelTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("tp-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  std::vector<double> train(const std::string& name, const std::string& model, const std::vector<std::string>& overrides) {
    const std::string yaml = model + testing::data_section(root_) +
                             "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
                             "train: {steps: 20, global_batch: 8, micro_batch: 4, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::losses_of(testing::train_run(root_, name, yaml, overrides));
  }

  double state_difference(const std::string& a, const std::string& b) { return testing::state_difference(root_, a, b); }
  void expect_same_losses(const std::vector<double>& reference, const std::vector<double>& other, size_t from = 0) {
    testing::expect_same_losses(reference, other, from);
  }

  static std::string root_;
};
std::string TensorParallelTraining::root_;

TEST_F(TensorParallelTraining, EveryLayoutComputesTheSameFunctionAsOneRank) {
  for (const auto& [model_name, model] : {std::pair{"gpt2", kGpt2Style}, std::pair{"llama", kLlamaHetero}}) {
    const std::string reference = std::string(model_name) + "-one";
    std::vector<double> one = train(reference, model, {});
    ASSERT_EQ(one.size(), 20u);
    EXPECT_LT(one.back(), one.front());
    for (int tp : {2, 4}) {
      for (bool sp : {false, true}) {
        const std::string name = std::string(model_name) + "-tp" + std::to_string(tp) + (sp ? "-sp" : "");
        SCOPED_TRACE(name);
        expect_same_losses(one, train(name, model, {"runtime.ranks=" + std::to_string(tp), "parallel.tp=" + std::to_string(tp),
                                                    std::string("parallel.sequence_parallel=") + (sp ? "true" : "false")}));
        EXPECT_LE(state_difference(reference, name), 1e-5);
      }
    }
    // tp x dp on one mesh, with the distributed optimizer.
    const std::string name = std::string(model_name) + "-tp2-dp2-zero1";
    SCOPED_TRACE(name);
    expect_same_losses(one, train(name, model, {"runtime.ranks=4", "parallel.tp=2", "parallel.sequence_parallel=true",
                                                "parallel.zero=1", "parallel.bucket_mb=0.01"}));
    EXPECT_LE(state_difference(reference, name), 1e-5);
  }
}

// Checkpoints store global tensors: a run stopped at tp = 2 continues at tp = 1 and tp = 4
// with the losses of the uninterrupted tp = 2 run.
TEST_F(TensorParallelTraining, CheckpointFromTp2ContinuesAtTp1AndTp4) {
  const std::vector<std::string> tp2 = {"runtime.ranks=2", "parallel.tp=2"};
  std::vector<double> full = train("ckpt-full", kLlamaHetero, tp2);
  std::vector<std::string> stop = tp2;
  stop.push_back("train.exit_interval=10");
  for (int tp : {1, 4}) {
    const std::string name = "ckpt-to-tp" + std::to_string(tp);
    train(name, kLlamaHetero, stop);
    fs::remove(root_ + "/" + name + "/metrics.jsonl");
    std::vector<double> resumed = train(name, kLlamaHetero, {"runtime.ranks=" + std::to_string(tp),
                                                             "parallel.tp=" + std::to_string(tp), "train.resume=true"});
    SCOPED_TRACE(name);
    expect_same_losses(full, resumed, 10);
  }
}

TEST_F(TensorParallelTraining, LayoutErrorsNameTheKeys) {
  try {
    train("bad-tp", kGpt2Style, {"runtime.ranks=3", "parallel.tp=2"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::train
