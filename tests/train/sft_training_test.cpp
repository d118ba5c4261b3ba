// Supervised fine-tuning on the shared trainer: packed rows (several conversations per row,
// no attention across them, positions restarting) train the same function as one conversation
// per row, at every parallel layout; tokens with loss weight 0 never contribute; a resumed
// fine-tuning run is bitwise the uninterrupted one; train.init_from loads weights only.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "loom/ckpt/digest.h"
#include "loom/config/run_config.h"
#include "loom/core/philox.h"
#include "loom/data/chat/chat_dataset.h"
#include "loom/kernels/types.h"
#include "loom/model/transformer.h"
#include "loom/train/run_ranks.h"
#include "loom/train/sft_source.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

constexpr int kSeq = 16;

// Eight conversations whose lengths FFD packs into exactly four full rows of 16 tokens
// (12+4, 10+6, 9+7, 8+8): a step of 4 packed rows or of 8 padded rows holds all of them.
std::vector<data::TokenizedConversation> conversations() {
  const std::vector<int> lengths = {9, 7, 10, 6, 12, 4, 8, 8};
  std::vector<data::TokenizedConversation> docs;
  for (size_t d = 0; d < lengths.size(); ++d) {
    data::TokenizedConversation doc;
    for (int k = 0; k < lengths[d]; ++k) {
      doc.tokens.push_back(static_cast<int32_t>(philox4x32(7, d, k)[0] % 256));
      doc.trained.push_back(k >= lengths[d] / 3 ? 1 : 0);  // a "prompt" third, then the answer
    }
    docs.push_back(doc);
  }
  return docs;
}

// The rows of another source with the targets of every weight-0 token replaced.
class FlippedMaskSource : public BatchSource {
 public:
  explicit FlippedMaskSource(const BatchSource& inner) : inner_(inner) {}
  void fill(int64_t first, TokenBatch& batch) const override {
    inner_.fill(first, batch);
    for (size_t i = 0; i < batch.targets.size(); ++i)
      if (batch.loss_weights[i] == 0.0f) batch.targets[i] = (batch.targets[i] + 101) % 256;
  }
  std::string describe() const override { return inner_.describe(); }

 private:
  const BatchSource& inner_;
};

class SftTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::temp_directory_path() / ("loom-sft-training-" + std::to_string(::getpid()))).string();
    fs::create_directories(root_);
    packed_ = data::make_rows(conversations(), kSeq, true, 0);
    padded_ = data::make_rows(conversations(), kSeq, false, 0);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static config::RunConfig config(const std::string& name, int global_batch, const std::vector<std::string>& overrides) {
    const std::string yaml =
        "run: {dir: " + root_ + "/" + name + "}\n" +
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
        "data: {tokenizer: byte, seq_len: 16}\n"
        "optim: {lr: 1.0e-3, warmup_steps: 1, clip_grad: 1.0}\n"
        "train: {steps: 4, global_batch: " + std::to_string(global_batch) + ", micro_batch: 2, threads: 1, seed: 1234}\n"
        "log: {progress: false, interval: 100}\n";
    return config::parse_config(yaml, name, overrides);
  }

  static std::vector<nlohmann::json> train(const std::string& name, const BatchSource& source, int global_batch,
                                           const std::vector<std::string>& overrides) {
    const config::RunConfig c = config(name, global_batch, overrides);
    std::ostringstream out;
    run_on_ranks(c, out, [&](comm::Communicator& world) { return train_rank(c, world, source, {}, out); });
    std::vector<nlohmann::json> records;
    std::ifstream metrics(root_ + "/" + name + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) records.push_back(nlohmann::json::parse(line));
    return records;
  }

  static std::string root_;
  static data::ChatRows packed_, padded_;
};
std::string SftTraining::root_;
data::ChatRows SftTraining::packed_, SftTraining::padded_;

TEST_F(SftTraining, TheFixtureFillsFourPackedRowsExactly) {
  EXPECT_EQ(packed_.rows, 4);
  EXPECT_EQ(padded_.rows, 8);
  EXPECT_DOUBLE_EQ(packed_.efficiency, 1.0);
  EXPECT_EQ(packed_.trained_tokens, padded_.trained_tokens);
}

TEST_F(SftTraining, PackedEqualsUnpackedAtEveryLayout) {
  const SftSource packed(packed_, 1234, true, "packed"), padded(padded_, 1234, true, "padded");
  const std::vector<nlohmann::json> reference = train("padded", padded, 8, {});
  ASSERT_EQ(reference.size(), 4u);
  const std::vector<std::vector<std::string>> layouts = {
      {},
      {"runtime.ranks=2"},                                                      // dp 2
      {"runtime.ranks=2", "parallel.tp=2"},                                     // tp 2
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},  // pp 2
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const std::string name = "packed" + std::to_string(i);
    const std::vector<nlohmann::json> other = train(name, packed, 4, layouts[i]);
    testing::expect_same_losses(testing::losses_of(reference), testing::losses_of(other));
    for (size_t s = 0; s < other.size(); ++s) {
      EXPECT_EQ(other[s].at("trained_tokens"), reference[s].at("trained_tokens")) << "step " << s + 1;
      const double norm = reference[s].at("grad_norm").get<double>();
      EXPECT_NEAR(other[s].at("grad_norm").get<double>(), norm, 1e-5 * norm) << "step " << s + 1;
    }
    // (Parameters after several Adam steps are not compared: the token sums run in another
    // order, and Adam's g / sqrt(v) turns rounding in near-zero gradients into lr-sized steps.)
  }
}

// The gradients themselves, on one rank: the packed rows' and the padded rows' agree.
TEST_F(SftTraining, PackedRowsGiveTheGradientsOfPaddedRows) {
  config::RunConfig c = config("gradients", 8, {});
  c.model.vocab_size = 256;
  model::Transformer model(c.model);
  model.initialize(c.train.seed);
  const auto gradients = [&](const data::ChatRows& rows, double& loss) {
    std::vector<int32_t> targets = rows.targets;
    for (size_t i = 0; i < targets.size(); ++i)
      if (rows.loss_weights[i] == 0.0f) targets[i] = kernels::kIgnoreIndex;
    model.params().zero_grads();
    const model::Packing packing = rows.packed ? model::Packing{rows.positions.data(), rows.documents.data()} : model::Packing{};
    loss = model.forward_backward(rows.inputs.data(), targets.data(), rows.rows, kSeq, 1.0f, packing);
    return std::vector<float>(model.params().grads(), model.params().grads() + model.params().total());
  };
  double packed_loss = 0.0, padded_loss = 0.0;
  const std::vector<float> packed = gradients(packed_, packed_loss), padded = gradients(padded_, padded_loss);
  EXPECT_NEAR(packed_loss, padded_loss, 1e-5 * padded_loss);
  float scale = 0.0f;
  for (float g : padded) scale = std::max(scale, std::fabs(g));
  ASSERT_GT(scale, 0.0f);
  int failures = 0;
  for (size_t i = 0; i < packed.size() && failures < 5; ++i) {
    if (std::fabs(packed[i] - padded[i]) > 1e-5f * scale) {
      ++failures;
      ADD_FAILURE() << "gradient " << i << ": " << packed[i] << " packed vs " << padded[i] << " padded";
    }
  }
}

TEST_F(SftTraining, TokensWithWeightZeroNeverContribute) {
  const SftSource packed(packed_, 1234, true, "packed");
  const FlippedMaskSource flipped(packed);
  const std::vector<nlohmann::json> a = train("mask-a", packed, 4, {"runtime.ranks=2"});
  const std::vector<nlohmann::json> b = train("mask-b", flipped, 4, {"runtime.ranks=2"});
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) EXPECT_EQ(a[s].at("loss"), b[s].at("loss")) << "step " << s + 1;
  EXPECT_EQ(ckpt::parameter_digest(root_ + "/mask-a/checkpoints"),
            ckpt::parameter_digest(root_ + "/mask-b/checkpoints"));
}

TEST_F(SftTraining, ResumeIsBitwiseAndInitFromLoadsWeightsOnly) {
  const SftSource packed(packed_, 1234, true, "packed");
  train("whole", packed, 4, {"optim.lr=1e-2"});
  train("split", packed, 4, {"optim.lr=1e-2", "train.exit_interval=2"});
  train("split", packed, 4, {"optim.lr=1e-2", "train.resume=true"});
  EXPECT_EQ(ckpt::parameter_digest(root_ + "/whole/checkpoints"),
            ckpt::parameter_digest(root_ + "/split/checkpoints"));
  // Fine-tuning from "whole": step 1's loss is that model's loss, far below a fresh model's.
  const std::vector<nlohmann::json> fresh = train("fresh", packed, 4, {"train.steps=1"});
  const std::vector<nlohmann::json> tuned =
      train("tuned", packed, 4, {"train.steps=1", "train.init_from=" + root_ + "/whole/checkpoints"});
  ASSERT_EQ(tuned.size(), 1u);
  EXPECT_LT(tuned[0].at("loss").get<double>(), fresh[0].at("loss").get<double>() - 0.01);
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root_ + "/tuned/checkpoints");
  EXPECT_EQ(checkpoint.state().at("step").get<int64_t>(), 1);
}

}  // namespace
}  // namespace loom::train
