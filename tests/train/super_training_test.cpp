// The layout invariant for Nemotron 3 Super's mix: Mamba-2, attention and latent squared-ReLU
// MoE layers with two multi-token prediction depths. Tensor parallelism, two pipeline stages that
// each hold two layer kinds (the MTP depths on the last), expert parallelism with ZeRO-1, ZeRO-3,
// context parallelism and recompute each compute the same function as one rank for 20 steps
// (losses and MTP losses per step: fp32, relative 1e-5; final parameters, Adam moments and the
// routers' expert biases: relative 5e-5, 1e-4 for cp, see kStateTolerance), with two depths of their own or one
// repeated, and a checkpoint saved at one layout continues at another.
#include <gtest/gtest.h>

#include <filesystem>

#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// Layers M * M E: the pipeline's two stages hold [M, *] and [M, E] plus the MTP depths.
const char* kSuper =
    "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        activation: relu2, tied_embeddings: false, layer_pattern: 'M*ME', mtp_depths: 2,\n"
    "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_latent_size: 16, moe_shared_ffn_size: 24,\n"
    "        moe_router: sigmoid, moe_expert_bias: true,\n"
    "        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 6}}\n"
    "parallel: {pipeline_partition: even}\n";

// The final state after 20 Adam steps: tensor parallelism's row-parallel sums (the shared
// expert's down_proj, the MTP blocks' o_proj) reassociate, and Adam turns the last-bit
// differences of near-zero gradients into lr-sized steps; measured up to 2.7e-5 (tp 2 + sp,
// the shared expert of layer 3), ep and pp within 1e-5. Context parallelism sums every weight
// gradient over two halves of each sequence: measured 5.9e-5 there (the same down_proj), so its
// bound is kContextStateTolerance. The per-step losses stay within 1e-5 in every layout.
constexpr double kStateTolerance = 5e-5;
constexpr double kContextStateTolerance = 1e-4;

double state_difference(const std::string& root, const std::string& a, const std::string& b,
                        double tolerance = kStateTolerance) {
  return testing::checkpoint_difference(
      root, a, b, [](const ckpt::LoadedCheckpoint& c) { return c.names(); },
      [tolerance](const std::string& name, double difference) {
        if (difference > tolerance) ADD_FAILURE() << name << ": relative difference " << difference;
      });
}

double tolerance_of(const std::string& layout) {
  return layout.find("cp2") != std::string::npos ? kContextStateTolerance : kStateTolerance;
}

class SuperTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("super-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  std::vector<nlohmann::json> train(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string yaml = std::string(kSuper) + testing::data_section(root_) +
                             "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
                             "train: {steps: 20, global_batch: 8, micro_batch: 4, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::train_run(root_, name, yaml, overrides);
  }

  static std::string root_;
};
std::string SuperTraining::root_;

TEST_F(SuperTraining, LayoutsComputeTheSameFunctionAsOneRank) {
  const std::vector<nlohmann::json> one = train("one", {});
  ASSERT_EQ(one.size(), 20u);
  const std::vector<double> losses = testing::losses_of(one), mtp = testing::column<double>(one, "mtp_loss");
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_LT(mtp.back(), mtp.front());
  // Depth 2 predicts a token further ahead: harder than the next one.
  EXPECT_GT(one.back().at("mtp_loss_2").get<double>(), losses.back());
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"tp2", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2", {"runtime.ranks=2", "parallel.pp=2"}},
      {"ep2", {"runtime.ranks=2", "parallel.ep=2", "parallel.zero=1"}},
      {"dp2-zero3", {"runtime.ranks=2", "parallel.zero=3"}},
      {"cp2", {"runtime.ranks=2", "parallel.cp=2"}},
      {"recompute", {"model.recompute=true"}},
  };
  for (const auto& [name, overrides] : layouts) {
    SCOPED_TRACE(name);
    const std::vector<nlohmann::json> other = train(name, overrides);
    testing::expect_same_losses(losses, testing::losses_of(other));
    testing::expect_same_losses(mtp, testing::column<double>(other, "mtp_loss"));
    EXPECT_LE(state_difference(root_, "one", name, tolerance_of(name)), tolerance_of(name));
  }
}

// Megatron-Core's mtp_use_repeated_layer: one depth's weights (mtp.layers.0 alone) run at both
// depths, their gradients the sum of both depths'; every layout computes it as one rank does, and
// it is another function than two depths of their own.
TEST_F(SuperTraining, ARepeatedDepthComputesTheSameFunctionInEveryLayout) {
  const std::vector<std::string> repeated = {"model.mtp_use_repeated_layer=true"};
  const std::vector<nlohmann::json> one = train("repeated-one", repeated);
  const std::vector<double> losses = testing::losses_of(one), mtp = testing::column<double>(one, "mtp_loss");
  EXPECT_LT(mtp.back(), mtp.front());
  const ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root_ + "/repeated-one/checkpoints");
  EXPECT_TRUE(checkpoint.has("mtp.layers.0.eh_proj.weight"));
  EXPECT_TRUE(checkpoint.has("mtp.layers.0.final_layernorm.weight"));
  for (const std::string& name : checkpoint.names()) EXPECT_EQ(name.find("mtp.layers.1."), std::string::npos) << name;
  const std::vector<double> own = testing::column<double>(train("own-depths", {}), "mtp_loss");
  EXPECT_GT(std::abs(own.back() - mtp.back()), 1e-4 * mtp.back());
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"repeated-tp2", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"repeated-pp2", {"runtime.ranks=2", "parallel.pp=2"}},
      {"repeated-ep2", {"runtime.ranks=2", "parallel.ep=2", "parallel.zero=1"}},
      {"repeated-cp2", {"runtime.ranks=2", "parallel.cp=2"}},
      {"repeated-recompute", {"model.recompute=true"}},
  };
  for (const auto& [name, layout] : layouts) {
    SCOPED_TRACE(name);
    std::vector<std::string> overrides = repeated;
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    const std::vector<nlohmann::json> other = train(name, overrides);
    testing::expect_same_losses(losses, testing::losses_of(other));
    testing::expect_same_losses(mtp, testing::column<double>(other, "mtp_loss"));
    EXPECT_LE(state_difference(root_, "repeated-one", name, tolerance_of(name)), tolerance_of(name));
  }
}

// 10 steps at pp 2, the next 10 at tp 2 x ep 2 from its checkpoint: the losses of the
// uninterrupted one-rank run.
TEST_F(SuperTraining, CheckpointContinuesAtAnotherLayout) {
  const std::vector<double> one = testing::losses_of(train("full", {}));
  train("moved", {"runtime.ranks=2", "parallel.pp=2", "train.exit_interval=10"});
  fs::remove(root_ + "/moved/metrics.jsonl");
  const std::vector<double> rest =
      testing::losses_of(train("moved", {"runtime.ranks=4", "parallel.tp=2", "parallel.ep=2", "train.resume=true"}));
  ASSERT_EQ(rest.size(), 10u);
  testing::expect_same_losses(std::vector<double>(one.begin() + 10, one.end()), rest);
}

}  // namespace
}  // namespace loom::train
