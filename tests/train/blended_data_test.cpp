// Pre-training on a weighted blend of datasets (data.train_blend, train/blended_source.h): each
// row is the sample its dataset holds at the index the blend picks; a blend of one dataset is that
// dataset; data-parallel ranks read the global batch one rank reads; a resumed run continues the
// blend bit for bit; the run says what it reads of each dataset.
#include "loom/train/blended_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class BlendedData : public ::testing::Test {
 protected:
  // root_/data/c_train (training_runs.h) and a second, smaller dataset of other text,
  // root_/data/d_train, of short documents, so that it is read for more than an epoch.
  static void SetUpTestSuite() {
    root_ = testing::make_training_root("blend-test");
    std::string lines;  // JSON lines: short documents, so samples cross their ends
    for (int i = 0; i < 10; ++i) {
      lines += R"({"text": "Call me Ishmael, said number )" + std::to_string(i * 13) + ".\"}\n";
    }
    std::ofstream(root_ + "/other.jsonl") << lines;
    auto tokenizer = data::make_tokenizer("byte");
    data::prepare_dataset({root_ + "/other.jsonl"}, *tokenizer, root_ + "/data/d", 0.0, 1);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string c() { return root_ + "/data/c_train"; }
  static std::string d() { return root_ + "/data/d_train"; }
  static std::string blend() {
    return "[{prefix: " + c() + ", weight: 0.6}, {prefix: " + d() + ", weight: 0.4}]";
  }

  std::vector<nlohmann::json> train(const std::string& name, const std::string& data,
                                    const std::vector<std::string>& overrides, std::string* console = nullptr) {
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
        "data: {tokenizer: byte, seq_len: 16, " + data + "}\n"
        "optim: {lr: 1.0e-3, warmup_steps: 2, schedule: wsd, wsd_decay_steps: 4}\n"
        "train: {steps: 12, global_batch: 8, micro_batch: 4, threads: 1}\n"
        "log: {progress: false, interval: 100}\n";
    return testing::train_run(root_, name, yaml, overrides, console);
  }

  static std::string root_;
};
std::string BlendedData::root_;

TEST_F(BlendedData, EachRowIsItsDatasetsSampleAtThePickedIndex) {
  const std::vector<config::BlendEntry> entries = {{c(), 0.6}, {d(), 0.4}};
  // Positions and document ids too (Megatron's reset_position_ids and reset_attention_mask).
  const DocumentOptions documents{true, true, false};
  const BlendedSource blended("data.train_blend", entries, 16, 1234, documents);
  const PretrainingSource sources[] = {PretrainingSource(c(), 16, 1234, documents),
                                       PretrainingSource(d(), 16, 1234, documents)};
  const data::BlendIndex index({0.6, 0.4});
  int64_t ends = 0;  // tokens after a document's end within their row
  for (const int64_t first : {int64_t{0}, int64_t{5}, int64_t{1000}}) {
    TokenBatch batch, row;
    batch.resize(12, 16);
    blended.fill(first, batch);
    const std::vector<data::BlendIndex::Pick> picks = index.picks(first, 12);
    int from_d = 0;
    for (int r = 0; r < 12; ++r) {
      row.resize(1, 16);
      sources[picks[r].dataset].fill(picks[r].sample, row);
      from_d += picks[r].dataset;
      for (int t = 0; t < 16; ++t) {
        ASSERT_EQ(batch.inputs[r * 16 + t], row.inputs[t]) << "row " << r << " of the batch from " << first;
        ASSERT_EQ(batch.targets[r * 16 + t], row.targets[t]) << "row " << r << " of the batch from " << first;
        ASSERT_EQ(batch.positions[r * 16 + t], row.positions[t]) << "row " << r << " of the batch from " << first;
        ASSERT_EQ(batch.documents[r * 16 + t], row.documents[t]) << "row " << r << " of the batch from " << first;
      }
    }
    ends += std::count_if(batch.documents.begin(), batch.documents.end(), [](int32_t id) { return id != 0; });
    EXPECT_GE(from_d, 4);  // 0.4 of 12 rows
    EXPECT_LE(from_d, 6);
  }
  EXPECT_GT(ends, 0);
  EXPECT_THROW(BlendedSource("data.val_blend", {{c(), 1.0}, {root_ + "/data/none", 1.0}}, 16, 1, {}), Error);
  try {
    BlendedSource("data.val_blend", {{c(), 1.0}, {root_ + "/data/none", 1.0}}, 16, 1, {});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val_blend[1].prefix = '" + root_ + "/data/none': "), std::string::npos)
        << e.what();
  }
}

TEST_F(BlendedData, ABlendOfOneDatasetTrainsAsThatDataset) {
  const std::vector<double> plain = testing::losses_of(train("plain", "train_prefix: " + c(), {}));
  const std::vector<double> alone =
      testing::losses_of(train("alone", "train_blend: [{prefix: " + c() + ", weight: 0.25}]", {}));
  ASSERT_EQ(plain.size(), 12u);
  EXPECT_EQ(plain, alone);
}

// Validation values of the records that have one.
std::vector<double> val_losses(const std::vector<nlohmann::json>& records) {
  std::vector<double> losses;
  for (const nlohmann::json& r : records) {
    if (r.contains("val_loss")) losses.push_back(r.at("val_loss").get<double>());
  }
  return losses;
}

TEST_F(BlendedData, DataParallelRanksTrainOnTheBlendAsOneRank) {
  const std::string data =
      "train_blend: " + blend() + ", val_blend: [{prefix: " + d() + "}, {prefix: " + c() + ", weight: 3}]";
  std::string console;
  // The same micro-batch size: evaluation reads train.eval_batches micro-batches.
  const std::vector<nlohmann::json> one =
      train("one", data, {"train.eval_interval=6", "train.micro_batch=2"}, &console);
  EXPECT_NE(console.find("data: blend of 2 datasets; samples [0, 96) read " + c() + " 60.4% (58 samples"),
            std::string::npos)
      << console;
  EXPECT_NE(console.find(d() + " 39.6% (38 samples"), std::string::npos) << console;
  const std::vector<nlohmann::json> two =
      train("two", data, {"train.eval_interval=6", "runtime.ranks=2", "train.micro_batch=2"});
  testing::expect_same_losses(testing::losses_of(one), testing::losses_of(two));
  ASSERT_EQ(val_losses(one).size(), 2u);
  testing::expect_same_losses(val_losses(one), val_losses(two));
  // The schedule (optim.schedule: wsd): warm-up over 2 steps, lr held, then 4 steps of annealing.
  for (const nlohmann::json& r : one) {
    const int step = r.at("step").get<int>();
    const double lr = r.at("lr").get<double>();
    if (step >= 2 && step <= 8) {
      EXPECT_DOUBLE_EQ(lr, 1.0e-3) << "step " << step;
    } else if (step > 8) {
      EXPECT_LT(lr, 1.0e-3) << "step " << step;
    }
  }
  // Another blend is another function of the data.
  const std::vector<double> other = testing::losses_of(
      train("other", "train_blend: [{prefix: " + c() + ", weight: 0.2}, {prefix: " + d() + ", weight: 0.8}]", {}));
  EXPECT_NE(testing::losses_of(one), other);
}

TEST_F(BlendedData, AResumedRunContinuesTheBlendBitForBit) {
  train("full", "train_blend: " + blend(), {});
  train("split", "train_blend: " + blend(), {"train.exit_interval=5"});
  std::string console;
  train("split", "train_blend: " + blend(), {"train.resume=true"}, &console);
  EXPECT_NE(console.find("data: blend of 2 datasets; samples [40, 96) read"), std::string::npos) << console;
  EXPECT_EQ(ckpt::parameter_digest(root_ + "/full/checkpoints"), ckpt::parameter_digest(root_ + "/split/checkpoints"));
}

}  // namespace
}  // namespace loom::train
