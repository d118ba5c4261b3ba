// Batches whose tokens carry loss weights: a layout trains the same function as one rank when
// some targets are masked (weight 0), and the loss is the mean over the global count of trained
// tokens, which the ranks agree on without reading each other's data.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "loom/config/run_config.h"
#include "loom/train/batch_source.h"
#include "loom/train/run_ranks.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// Pre-training samples with a deterministic mask by global sample index: every third position
// of a sample (offset by the sample) is not trained on, and every fifth sample not at all.
class MaskingSource : public BatchSource {
 public:
  MaskingSource(const std::string& prefix, int seq_len) : inner_(prefix, seq_len, 1234) {}
  void fill(int64_t first, TokenBatch& batch) const override {
    inner_.fill(first, batch);
    for (int b = 0; b < batch.batch; ++b) {
      const int64_t sample = first + b;
      for (int t = 0; t < batch.seq; ++t) {
        if (trained(sample, t)) continue;
        batch.loss_weights[static_cast<size_t>(b) * batch.seq + t] = 0.0f;
      }
    }
  }
  std::string describe() const override { return "masked " + inner_.describe(); }
  static bool trained(int64_t sample, int t) { return sample % 5 != 0 && (sample + t) % 3 != 0; }

 private:
  PretrainingSource inner_;
};

class MaskedBatches : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("masked-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Trains root_/name on the masking source; returns metrics.jsonl's records.
  std::vector<nlohmann::json> train(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string yaml =
        "run: {dir: " + root_ + "/" + name + "}\n" +
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n" +
        testing::data_section(root_) +
        "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
        "train: {steps: 6, global_batch: 8, micro_batch: 2, threads: 1, seed: 1234}\n"
        "log: {progress: false, interval: 100}\n";
    const config::RunConfig config = config::parse_config(yaml, name, overrides);
    std::ostringstream out;
    const MaskingSource source(config.data.train_prefix, config.data.seq_len);
    run_on_ranks(config, out, [&](comm::Communicator& world) { return train_rank(config, world, source, {}, out); });
    std::vector<nlohmann::json> records;
    std::ifstream metrics(root_ + "/" + name + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) records.push_back(nlohmann::json::parse(line));
    return records;
  }

  static std::string root_;
};
std::string MaskedBatches::root_;

std::vector<int64_t> token_counts(const std::vector<nlohmann::json>& records) {
  return testing::column<int64_t>(records, "trained_tokens");
}

TEST_F(MaskedBatches, EveryLayoutTrainsTheSameFunctionAsOneRank) {
  const std::vector<nlohmann::json> one = train("one", {});
  ASSERT_EQ(one.size(), 6u);
  const std::vector<double> reference = testing::losses_of(one);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=4", "parallel.tp=2"},                         // dp 2 x tp 2
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},  // pp 2
      {"runtime.ranks=2", "parallel.zero=3"},                       // ZeRO-3 over dp 2
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const std::vector<nlohmann::json> other = train("layout" + std::to_string(i), layouts[i]);
    testing::expect_same_losses(reference, testing::losses_of(other));
    EXPECT_EQ(token_counts(other), token_counts(one));
  }
}

TEST_F(MaskedBatches, MaskedTokensAreLeftOutOfTheGlobalTokenCount) {
  const std::vector<nlohmann::json> records = train("count", {"runtime.ranks=2"});
  ASSERT_EQ(records.size(), 6u);
  const int global_batch = 8, seq = 16;
  for (size_t s = 0; s < records.size(); ++s) {
    int64_t expected = 0;
    for (int b = 0; b < global_batch; ++b) {
      for (int t = 0; t < seq; ++t) expected += MaskingSource::trained(static_cast<int64_t>(s) * global_batch + b, t);
    }
    EXPECT_EQ(records[s].at("trained_tokens").get<int64_t>(), expected) << "step " << s + 1;
    EXPECT_LT(expected, global_batch * seq);
  }
}

TEST_F(MaskedBatches, AWeightOtherThanZeroOrOneIsRefusedNamingTheSource) {
  const MaskingSource source(root_ + "/data/c_train", 16);
  TokenBatch batch;
  batch.resize(2, 16);
  source.fill(10, batch);
  batch.loss_weights[16 + 3] = 0.5f;
  try {
    batch.mask_and_count(source, 10);
    FAIL() << "a weight of 0.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("masked " + root_ + "/data/c_train: sample 11 position 3 has loss weight 0.5"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::train
