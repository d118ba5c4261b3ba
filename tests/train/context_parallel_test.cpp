// The layout invariant for context parallelism: cp ranks (threads backend), each holding 2 of a
// sequence's 2 x cp load-balanced chunks, with ring attention (p2p) or Ulysses all-to-all (a2a),
// train the same function as one rank for 20 steps
// (losses per step and final parameters and Adam moments, fp32: relative 1e-5), alone and composed with tensor/sequence, pipeline and data parallelism with ZeRO-1 and
// ZeRO-3.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "loom/core/error.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// RoPE, GQA 8/4 (a2a at cp 4: one kv head per rank).
const char* kLlama =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 8, kv_heads: 4, ffn_size: 48, max_seq_len: 32}\n";
// Learned positions: the embedding reads each token's global position.
const char* kGpt2Style =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, max_seq_len: 32, norm: layer,\n"
    "        activation: gelu, positions: learned, bias: true}\n";

class ContextParallelTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("cp-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::vector<double> train(const std::string& name, const std::string& model,
                                   const std::vector<std::string>& overrides, int steps = 20) {
    const std::string yaml = model + testing::data_section(root_) +
                             "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
                             "train: {steps: " + std::to_string(steps) + ", global_batch: 8, micro_batch: 4, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::losses_of(testing::train_run(root_, name, yaml, overrides));
  }
  static std::vector<std::string> cp_layout(int cp, const std::string& comm, int ranks) {
    return {"runtime.ranks=" + std::to_string(ranks), "parallel.cp=" + std::to_string(cp), "parallel.cp_comm=" + comm};
  }

  static std::string root_;
};
std::string ContextParallelTraining::root_;

TEST_F(ContextParallelTraining, Cp2AndCp4WithEitherExchangeEqualOneRank) {
  for (const auto& [model_name, model] : {std::pair{"llama", kLlama}, std::pair{"gpt2", kGpt2Style}}) {
    const std::string reference = std::string(model_name) + "-one";
    const std::vector<double> one = train(reference, model, {});
    ASSERT_EQ(one.size(), 20u);
    EXPECT_LT(one.back(), one.front());
    for (const std::string comm : {"p2p", "a2a"}) {
      for (int cp : {2, 4}) {
        const std::string name = std::string(model_name) + "-cp" + std::to_string(cp) + "-" + comm;
        SCOPED_TRACE(name);
        testing::expect_same_losses(one, train(name, model, cp_layout(cp, comm, cp)));
        EXPECT_LE(testing::state_difference(root_, reference, name), 1e-5);
      }
    }
  }
}

// Context parallelism composed with the other axes (Megatron's rank order tp-cp-dp-pp): fewer
// steps keep them fast; every step's loss and the final state within 1e-5 of one rank.
TEST_F(ContextParallelTraining, ComposesWithTensorPipelineAndDataParallelism) {
  const std::string layered =
      "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 8, kv_heads: 4, ffn_size: 48, max_seq_len: 32}\n";
  const std::vector<double> one = train("composed-one", layered, {}, 6);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"tp2-sp-cp2", {"runtime.ranks=4", "parallel.tp=2", "parallel.sequence_parallel=true", "parallel.cp=2"}},
      {"cp2-pp2", {"runtime.ranks=4", "parallel.pp=2", "parallel.cp=2"}},
      {"cp2-dp2-zero1", {"runtime.ranks=4", "parallel.cp=2", "parallel.zero=1", "parallel.bucket_mb=0.01"}},
      {"cp2-dp2-zero3", {"runtime.ranks=4", "parallel.cp=2", "parallel.zero=3"}},
  };
  for (const std::string comm : {"p2p", "a2a"}) {
    for (const auto& [layout, overrides] : layouts) {
      const std::string name = layout + "-" + comm;
      SCOPED_TRACE(name);
      std::vector<std::string> with_comm = overrides;
      with_comm.push_back("parallel.cp_comm=" + comm);
      testing::expect_same_losses(one, train(name, layered, with_comm, 6));
      EXPECT_LE(testing::state_difference(root_, "composed-one", name), 1e-5);
    }
  }
}

// Recompute and mixed precision: each setting on one rank and at cp 2 with either exchange.
// Recompute (fp32): every step's loss within 1e-5. The precision recipes (both blocks in the
// recipe, as the edge layers would otherwise be bf16 in a 2-layer model): cp sums attention's
// partial results in another fp32 order, so a bf16 output may round one ulp (2^-8) the other way
// now and then, and an FP8 cast downstream can turn that into one FP8 step of an element; the
// bound is that of tensor and data parallelism under the same recipes
// (tests/train/precision_training_test.cpp): 2e-3 relative per step.
TEST_F(ContextParallelTraining, ComposesWithRecomputeAndPrecisionRecipes) {
  const std::vector<std::vector<std::string>> settings = {{"model.recompute=true"},
                                                          {"precision.recipe=bf16"},
                                                          {"precision.recipe=fp8_delayed"},
                                                          {"precision.recipe=fp8_current"},
                                                          {"precision.recipe=mxfp8"},
                                                          {"precision.recipe=fp8_blockwise"}};
  for (std::vector<std::string> setting : settings) {
    const std::string tag = setting[0].substr(setting[0].find('=') + 1);
    const bool fp32 = setting[0].starts_with("model.");
    if (!fp32) setting.push_back("precision.fp8_edge_layers_bf16=false");
    const std::vector<double> one = train("one-" + tag, kLlama, setting, 6);
    for (const std::string comm : {"p2p", "a2a"}) {
      std::vector<std::string> overrides = cp_layout(2, comm, 2);
      overrides.insert(overrides.end(), setting.begin(), setting.end());
      const std::string name = "cp2-" + comm + "-" + tag;
      SCOPED_TRACE(name);
      testing::expect_same_losses(one, train(name, kLlama, overrides, 6), 0, fp32 ? 1e-5 : 2e-3);
    }
  }
}

// Evaluation: every cp rank of the first replica evaluates its share of the validation tokens and
// the shares are summed; the validation loss equals one rank's, also through a pipeline.
TEST_F(ContextParallelTraining, EvaluationEqualsOneRank) {
  const std::vector<std::string> eval = {"data.val_prefix=" + root_ + "/data/c_train", "train.eval_interval=2",
                                         "train.eval_batches=2"};
  auto val_losses = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), eval.begin(), eval.end());
    const std::string yaml = std::string("model: {vocab_size: 0, d_model: 32, layers: 2, heads: 8, kv_heads: 4, ffn_size: 48, "
                                         "max_seq_len: 32}\n") +
                             testing::data_section(root_) +
                             "optim: {lr: 1.0e-3, warmup_steps: 2}\n"
                             "train: {steps: 4, global_batch: 8, micro_batch: 4, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    std::vector<double> losses;
    for (const nlohmann::json& r : testing::train_run(root_, name, yaml, overrides))
      if (r.contains("val_loss")) losses.push_back(r.at("val_loss").get<double>());
    return losses;
  };
  const std::vector<double> one = val_losses("eval-one", {});
  ASSERT_EQ(one.size(), 2u);
  for (const auto& [name, overrides] :
       {std::pair{std::string("eval-cp2-p2p"), cp_layout(2, "p2p", 2)},
        std::pair{std::string("eval-cp2-pp2-a2a"), std::vector<std::string>{"runtime.ranks=4", "parallel.cp=2",
                                                                           "parallel.pp=2", "parallel.cp_comm=a2a"}}}) {
    SCOPED_TRACE(name);
    testing::expect_same_losses(one, val_losses(name, overrides));
  }
}

// Checkpoints hold no trace of cp: a run stopped at cp = 2 continues at cp = 1, and one stopped
// at cp = 1 continues at cp = 2, with the losses of the uninterrupted runs.
TEST_F(ContextParallelTraining, CheckpointsMoveBetweenCp2AndCp1) {
  const std::vector<std::string> cp2 = cp_layout(2, "p2p", 2), one = {"runtime.ranks=1"};
  const std::vector<double> full = train("ckpt-full", kLlama, {}, 8);
  for (const auto& [name, first, then] : {std::tuple{"ckpt-cp2-to-1", cp2, one}, std::tuple{"ckpt-1-to-cp2", one, cp2}}) {
    std::vector<std::string> stop = first;
    stop.push_back("train.exit_interval=4");
    train(name, kLlama, stop, 8);
    fs::remove(root_ + "/" + name + "/metrics.jsonl");
    std::vector<std::string> resume = then;
    resume.push_back("train.resume=true");
    SCOPED_TRACE(name);
    testing::expect_same_losses(full, train(name, kLlama, resume, 8), 4);
  }
}

// Multi-token prediction looks k tokens ahead, across the ranks' chunks: cp 2 (ring and
// all-to-all, alone and with tensor + sequence parallelism) trains every depth as one rank does.
TEST_F(ContextParallelTraining, MultiTokenPredictionEqualsOneRank) {
  auto run = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.push_back("model.mtp_depths=2");
    const std::string yaml = std::string(kLlama) + testing::data_section(root_) +
                             "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
                             "train: {steps: 8, global_batch: 8, micro_batch: 4, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::train_run(root_, name, yaml, overrides);
  };
  const std::vector<nlohmann::json> one = run("mtp-one", {});
  ASSERT_EQ(one.size(), 8u);
  const std::vector<std::vector<std::string>> layouts = {
      cp_layout(2, "p2p", 2), cp_layout(2, "a2a", 2),
      {"runtime.ranks=4", "parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}};
  for (size_t i = 0; i < layouts.size(); ++i) {
    const std::string name = "mtp-layout-" + std::to_string(i);
    SCOPED_TRACE(name);
    const std::vector<nlohmann::json> records = run(name, layouts[i]);
    testing::expect_same_losses(testing::losses_of(one), testing::losses_of(records));
    for (const std::string depth : {"mtp_loss_1", "mtp_loss_2"}) {
      testing::expect_same_losses(testing::column<double>(one, depth), testing::column<double>(records, depth));
    }
    EXPECT_LE(testing::state_difference(root_, "mtp-one", name), 1e-5);
  }
}

// Layouts that cannot work are refused before any rank starts, naming the key and what is valid.
TEST_F(ContextParallelTraining, LayoutErrorsNameTheKeys) {
  auto refused = [&](const std::string& name, const std::string& model, const std::vector<std::string>& overrides) {
    try {
      train(name, model, overrides, 1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  EXPECT_NE(refused("odd-seq", kLlama, {"runtime.ranks=3", "parallel.cp=3", "parallel.cp_comm=a2a"})
                .find("data.seq_len 16 must be a multiple of 2 x parallel.cp = 6"),
            std::string::npos);
  EXPECT_NE(refused("kv", kLlama, {"runtime.ranks=8", "parallel.cp=8", "data.seq_len=16", "parallel.cp_comm=a2a"})
                .find("layer 0 has 4 kv heads, 4 per tensor-parallel rank (parallel.tp 1), not a multiple of parallel.cp 8"),
            std::string::npos);
  EXPECT_NE(refused("heads", kGpt2Style, {"runtime.ranks=8", "parallel.tp=4", "parallel.cp=2", "parallel.cp_comm=a2a"})
                .find("model.heads 4 / parallel.tp 4 must be a multiple of parallel.cp 2"),
            std::string::npos);
  EXPECT_NE(refused("world", kLlama, {"runtime.ranks=3", "parallel.cp=2"}).find("parallel.tp x parallel.cp x parallel.pp"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::train
