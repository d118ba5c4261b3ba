// The layout invariant for pipeline parallelism (threads backend): pp = 2 and 4 with GPipe,
// 1F1B and interleaved (v = 2) schedules, tp x pp x dp on 8 ranks with sequence parallelism and
// ZeRO-1, ZeRO-2 under 1F1B and interleaving, and heterogeneous layers cut by cost, each train
// the same function as one rank for 20 steps (every step's loss and the final parameters and
// moments, fp32: relative 1e-5). Checkpoints written with a pipeline continue without one and
// the other way round; layouts that cannot run are errors naming the keys.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/error.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// Eight layers so that 4 stages x 2 virtual stages each hold one; tied embeddings (the last
// stage keeps a copy of the embedding).
const char* kGpt2Style =
    "model: {vocab_size: 0, d_model: 32, layers: 8, heads: 4, ffn_size: 64, max_seq_len: 32, norm: layer,\n"
    "        activation: gelu, positions: learned, bias: true, tied_embeddings: true}\n";
// Layers of very different cost: a cost-balanced split differs from an even one.
const char* kLlamaHetero =
    "model: {vocab_size: 0, d_model: 32, layers: 6, heads: 8, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        tied_embeddings: false,\n"
    "        block_configs: [{attention: normal, ffn_size: 192}, {attention: skip, ffn_size: 32}, {ffn_size: 0},\n"
    "                        {attention: skip, ffn_size: 16}, {kv_heads: 4, ffn_size: 0}, {attention: skip}]}\n";

class PipelineTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("pp-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // 8 micro-batches of one sequence per step (per data-parallel replica: 8 / dp).
  std::vector<double> train(const std::string& name, const std::string& model, const std::vector<std::string>& overrides,
                            std::string* console = nullptr) {
    const std::string yaml = model + testing::data_section(root_) +
                             "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
                             "train: {steps: 20, global_batch: 8, micro_batch: 1, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::losses_of(testing::train_run(root_, name, yaml, overrides, console));
  }

  void expect_same_run(const std::vector<double>& one, const std::string& reference, const std::string& name,
                       const std::string& model, const std::vector<std::string>& overrides) {
    SCOPED_TRACE(name);
    testing::expect_same_losses(one, train(name, model, overrides));
    EXPECT_LE(testing::state_difference(root_, reference, name), 1e-5);
  }

  static std::string root_;
};
std::string PipelineTraining::root_;

TEST_F(PipelineTraining, EveryScheduleComputesTheSameFunctionAsOneRank) {
  std::vector<double> one = train("gpt2-one", kGpt2Style, {});
  ASSERT_EQ(one.size(), 20u);
  EXPECT_LT(one.back(), one.front());
  for (int pp : {2, 4}) {
    for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
      const std::string name = "gpt2-pp" + std::to_string(pp) + "-" + schedule;
      expect_same_run(one, "gpt2-one", name, kGpt2Style,
                      {"runtime.ranks=" + std::to_string(pp), "parallel.pp=" + std::to_string(pp),
                       "parallel.pipeline_schedule=" + schedule,
                       "parallel.virtual_stages=" + std::string(schedule == "interleaved" ? "2" : "1")});
    }
  }
}

TEST_F(PipelineTraining, ComposesWithTensorAndDataParallelismAndZero) {
  std::vector<double> one = train("3d-one", kGpt2Style, {});
  // Splitting GEMMs over tensor-parallel ranks reassociates their sums; a few weights of this
  // model get first-step gradients of ~6e-9 (near Adam's eps) that are mostly cancellation, so
  // their updates move by ~5e-5 of the tensor's scale between tp = 1 and tp = 2, from the first
  // step on and without growing. The final state of runs with tp = 2 is therefore compared with
  // tp = 2 without the pipeline; every step's loss still with one rank.
  const std::vector<std::string> tp2 = {"runtime.ranks=2", "parallel.tp=2"};
  testing::expect_same_losses(one, train("3d-tp2", kGpt2Style, tp2));
  // 3D: tp = 2 x pp = 2 x dp = 2 on 8 ranks.
  expect_same_run(one, "3d-tp2", "3d-tp2-pp2-dp2", kGpt2Style,
                  {"runtime.ranks=8", "parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true",
                   "parallel.zero=1", "parallel.bucket_mb=0.01"});
  // ZeRO-2 reduces after every backward under 1F1B, once per step when interleaved.
  expect_same_run(one, "3d-one", "pp2-dp2-zero2-1f1b", kGpt2Style,
                  {"runtime.ranks=4", "parallel.pp=2", "parallel.zero=2", "parallel.bucket_mb=0.01"});
  expect_same_run(one, "3d-one", "pp2-dp2-zero2-interleaved", kGpt2Style,
                  {"runtime.ranks=4", "parallel.pp=2", "parallel.zero=2", "parallel.pipeline_schedule=interleaved",
                   "parallel.virtual_stages=2", "model.recompute=true"});
}

TEST_F(PipelineTraining, HeterogeneousLayersBalancedByCost) {
  std::vector<double> one = train("hetero-one", kLlamaHetero, {});
  std::string console;
  SCOPED_TRACE("hetero-pp2-balanced");
  testing::expect_same_losses(one, train("hetero-pp2-balanced", kLlamaHetero,
                                         {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_partition=balanced"},
                                         &console));
  EXPECT_LE(testing::state_difference(root_, "hetero-one", "hetero-pp2-balanced"), 1e-5);
  // The first layer's wide MLP weighs about as much as the other five and the head: it gets a
  // stage of its own (an even split would give each stage three layers).
  EXPECT_NE(console.find("layers of this rank: [0, 1)"), std::string::npos) << console;
  expect_same_run(one, "hetero-one", "hetero-pp3-explicit", kLlamaHetero,
                  {"runtime.ranks=3", "parallel.pp=3", "parallel.pipeline_partition=1,3,2"});
}

// Checkpoints store global tensors whatever the layout: a run stopped with a pipeline continues
// on one rank, and one stopped on one rank continues with 3D parallelism, with the losses of the
// uninterrupted run.
TEST_F(PipelineTraining, CheckpointsMoveBetweenPipelineLayouts) {
  const std::vector<std::string> pp2 = {"runtime.ranks=2", "parallel.pp=2"};
  std::vector<double> full = train("ckpt-full", kGpt2Style, pp2);
  const std::vector<std::vector<std::string>> from_to = {
      {"runtime.ranks=2", "parallel.pp=2"}, {"runtime.ranks=1"},
      {"runtime.ranks=1"}, {"runtime.ranks=8", "parallel.tp=2", "parallel.pp=2", "parallel.zero=1"}};
  for (size_t i = 0; i < from_to.size(); i += 2) {
    const std::string name = "ckpt-" + std::to_string(i);
    std::vector<std::string> stop = from_to[i];
    stop.push_back("train.exit_interval=10");
    train(name, kGpt2Style, stop);
    fs::remove(root_ + "/" + name + "/metrics.jsonl");
    std::vector<std::string> resume = from_to[i + 1];
    resume.push_back("train.resume=true");
    SCOPED_TRACE(name);
    testing::expect_same_losses(full, train(name, kGpt2Style, resume), 10);
  }
}

// FP8 with delayed scaling keeps an amax history per GEMM: the stages agree on their amaxes with
// the ranks holding the same layers and checkpoint their own histories by GEMM name, so a
// pipeline trains as one rank and its checkpoint continues on one rank with the same losses.
TEST_F(PipelineTraining, Fp8DelayedScalingAcrossStagesAndCheckpoints) {
  const std::vector<std::string> fp8 = {"precision.recipe=fp8_delayed", "precision.fp8_edge_layers_bf16=false"};
  std::vector<double> one = train("fp8-one", kLlamaHetero, fp8);
  std::vector<std::string> pp2 = fp8;
  // FP8 rounds weights and activations coarsely, so a 1e-7 change of a weight can flip a rounding
  // and grow. A pipeline changes no sum except the tied embedding's (its two halves are added
  // once instead of micro-batch by micro-batch), data parallelism's and the global norm's (the
  // stages' sums of squares, exact in fp64, added over the stages: equal to one rank's to fp64
  // rounding, and so is the fp32 clip factor here): this model is untied and there is no data
  // parallelism, so the runs end with one rank's weights and moments bit for bit.
  pp2.insert(pp2.end(), {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=interleaved",
                         "parallel.virtual_stages=2"});
  testing::expect_same_losses(one, train("fp8-pp2", kLlamaHetero, pp2));
  EXPECT_EQ(testing::state_difference(root_, "fp8-one", "fp8-pp2"), 0.0);
  std::vector<std::string> stop = pp2;
  stop.push_back("train.exit_interval=10");
  train("fp8-resume", kLlamaHetero, stop);
  fs::remove(root_ + "/fp8-resume/metrics.jsonl");
  std::vector<std::string> resume = fp8;
  resume.push_back("train.resume=true");
  SCOPED_TRACE("fp8-resume");
  testing::expect_same_losses(one, train("fp8-resume", kLlamaHetero, resume), 10);
}

TEST_F(PipelineTraining, LayoutsThatCannotRunAreErrorsNamingTheKeys) {
  auto expect_error = [&](const std::vector<std::string>& overrides, const std::string& needle) {
    try {
      train("bad", kGpt2Style, overrides);
      ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({"runtime.ranks=4", "parallel.pp=3"}, "parallel.pp");
  expect_error({"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=interleaved",
                "parallel.virtual_stages=2", "train.global_batch=5"},
               "multiple of the stages");
  expect_error({"runtime.ranks=4", "parallel.pp=4", "parallel.pipeline_schedule=interleaved",
                "parallel.virtual_stages=4"},
               "only 8 layers");
  expect_error({"runtime.ranks=2", "parallel.pp=2", "parallel.zero=3"}, "parallel.zero=3");
  expect_error({"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_partition=4,5"}, "pipeline_partition");
}

}  // namespace
}  // namespace loom::train
