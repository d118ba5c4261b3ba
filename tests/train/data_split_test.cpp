// data.split (Megatron's --split): the training datasets' sequences cut into train, validation
// and test parts. A split run trains, validates and tests exactly as the run that names datasets
// holding each part's sequences alone (blends too); the test set is evaluated once, after the last
// step, on every layout as on one rank; a part too small to read is an error naming data.split.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/data/dataset_split.h"
#include "loom/data/indexed_dataset.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

constexpr data::SplitPart kParts[] = {data::SplitPart::Train, data::SplitPart::Validation, data::SplitPart::Test};

class DataSplit : public ::testing::Test {
 protected:
  // Two datasets of short documents (one per JSON line), root_/data/e_train of 200 and
  // root_/data/d_train of 40, and for both the datasets of each part of the split 8,1,1 alone:
  // <prefix>_train, _validation, _test.
  static void SetUpTestSuite() {
    root_ = testing::make_training_root("split-test");
    write_dataset("e", 200, "It is a truth universally acknowledged, item ", 7);
    write_dataset("d", 40, "Call me Ishmael, said number ", 13);
    for (const std::string& prefix : {e(), d()}) {
      const data::IndexedDataset whole = data::IndexedDataset::open(prefix);
      for (const data::SplitPart part : kParts) {
        const data::SequenceRange range = data::split_range({8, 1, 1}, part, whole.num_sequences());
        data::IndexedDatasetWriter writer(prefix + "_" + data::split_part_name(part), data::TokenDType::kInt32);
        for (int64_t i = range.begin; i < range.end; ++i) writer.add_document(whole.sequence(i));
        writer.finish();
      }
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static void write_dataset(const std::string& name, int documents, const std::string& text, int step) {
    std::string lines;
    for (int i = 0; i < documents; ++i) lines += R"({"text": ")" + text + std::to_string(i * step) + ".\"}\n";
    std::ofstream(root_ + "/" + name + ".jsonl") << lines;
    const std::string input = root_ + "/" + name + ".jsonl";
    data::prepare_dataset({input}, *data::make_tokenizer("byte"), root_ + "/data/" + name, 0.0, 1);
  }

  static std::string e() { return root_ + "/data/e_train"; }
  static std::string d() { return root_ + "/data/d_train"; }
  static std::string part(const std::string& prefix, data::SplitPart p) {
    return prefix + "_" + data::split_part_name(p);
  }

  std::vector<nlohmann::json> train(const std::string& name, const std::string& data,
                                    const std::vector<std::string>& overrides, std::string* console = nullptr) {
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
        "data: {tokenizer: byte, seq_len: 16, " + data + "}\n"
        "optim: {lr: 1.0e-3, warmup_steps: 2}\n"
        "train: {steps: 8, global_batch: 8, micro_batch: 4, threads: 1, eval_interval: 4, eval_batches: 2}\n"
        "log: {progress: false, interval: 100}\n";
    return testing::train_run(root_, name, yaml, overrides, console);
  }

  static std::string root_;
};
std::string DataSplit::root_;

// The values of `key` in the records that have one.
std::vector<double> values_of(const std::vector<nlohmann::json>& records, const std::string& key) {
  std::vector<double> values;
  for (const nlohmann::json& r : records) {
    if (r.contains(key)) values.push_back(r.at(key).get<double>());
  }
  return values;
}

TEST_F(DataSplit, ASplitDatasetTrainsAsItsPartsNamedAlone) {
  std::string console;
  const std::vector<nlohmann::json> split = train("split", "train_prefix: " + e() + ", split: '8,1,1'", {}, &console);
  const data::SequenceRange test = data::split_range({8, 1, 1}, data::SplitPart::Test,
                                                     data::IndexedDataset::open(e()).num_sequences());
  const std::string test_name = e() + " (test part of data.split = 8,1,1: sequences [" + std::to_string(test.begin) +
                                ", " + std::to_string(test.end) + "))";
  EXPECT_NE(console.find("data: " + e() + " (train part of data.split = 8,1,1: sequences [0, "), std::string::npos)
      << console;
  EXPECT_NE(console.find("evaluation: 2 micro-batches of " + e() + " (validation part of data.split = 8,1,1"),
            std::string::npos)
      << console;
  EXPECT_NE(console.find(", of " + test_name + " after the last step"), std::string::npos) << console;
  EXPECT_NE(console.find("step 8: test_loss "), std::string::npos) << console;
  const std::vector<nlohmann::json> alone =
      train("alone",
            "train_prefix: " + part(e(), kParts[0]) + ", val_prefix: " + part(e(), kParts[1]) +
                ", test_prefix: " + part(e(), kParts[2]),
            {});
  ASSERT_EQ(split.size(), 8u);
  EXPECT_EQ(testing::losses_of(split), testing::losses_of(alone));
  EXPECT_EQ(values_of(split, "val_loss"), values_of(alone, "val_loss"));
  ASSERT_EQ(values_of(split, "test_loss").size(), 1u);  // once, in the last step's record
  EXPECT_TRUE(split.back().contains("test_loss"));
  EXPECT_EQ(values_of(split, "test_loss"), values_of(alone, "test_loss"));
  // The three sets differ: the test loss is not the validation loss.
  EXPECT_NE(values_of(split, "test_loss")[0], values_of(split, "val_loss").back());
  // The whole dataset trains otherwise.
  EXPECT_NE(testing::losses_of(train("whole", "train_prefix: " + e(), {})), testing::losses_of(split));
}

TEST_F(DataSplit, ABlendSplitsEachDataset) {
  const std::string blend = "[{prefix: " + e() + ", weight: 0.6}, {prefix: " + d() + ", weight: 0.4}]";
  const std::vector<nlohmann::json> split = train("blend-split", "train_blend: " + blend + ", split: [8, 1, 1]", {});
  auto parts_blend = [&](data::SplitPart p) {
    return "[{prefix: " + part(e(), p) + ", weight: 0.6}, {prefix: " + part(d(), p) + ", weight: 0.4}]";
  };
  const std::vector<nlohmann::json> alone =
      train("blend-alone",
            "train_blend: " + parts_blend(kParts[0]) + ", val_blend: " + parts_blend(kParts[1]) +
                ", test_blend: " + parts_blend(kParts[2]),
            {});
  EXPECT_EQ(testing::losses_of(split), testing::losses_of(alone));
  EXPECT_EQ(values_of(split, "val_loss"), values_of(alone, "val_loss"));
  ASSERT_EQ(values_of(split, "test_loss").size(), 1u);
  EXPECT_EQ(values_of(split, "test_loss"), values_of(alone, "test_loss"));
}

// A share of 0: no such set (no test loss here); one number: all of it trained on.
TEST_F(DataSplit, AZeroShareHasNoSet) {
  const std::vector<nlohmann::json> no_test = train("no-test", "train_prefix: " + e() + ", split: '9,1,0'", {});
  EXPECT_TRUE(values_of(no_test, "test_loss").empty());
  EXPECT_EQ(values_of(no_test, "val_loss").size(), 2u);
  const std::vector<nlohmann::json> all = train("all", "train_prefix: " + e() + ", split: '1'", {});
  EXPECT_EQ(testing::losses_of(all), testing::losses_of(train("plain", "train_prefix: " + e(), {})));
  EXPECT_TRUE(values_of(all, "val_loss").empty());
}

TEST_F(DataSplit, EveryLayoutTestsAsOneRank) {
  const std::string data = "train_prefix: " + e() + ", split: '8,1,1'";
  const std::vector<double> one = values_of(train("one", data, {}), "test_loss");
  ASSERT_EQ(one.size(), 1u);
  int runs = 0;
  for (const std::vector<std::string>& layout :
       std::vector<std::vector<std::string>>{{"runtime.ranks=2"},
                                             {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},
                                             {"runtime.ranks=2", "parallel.pp=2"},
                                             {"runtime.ranks=2", "parallel.zero=3"}}) {
    SCOPED_TRACE(layout.back());
    const std::vector<nlohmann::json> records = train("layout-" + std::to_string(++runs), data, layout);
    testing::expect_same_losses(one, values_of(records, "test_loss"));
  }
}

// The test set waits for the last step: a run stopped early has none, its resumed end has the
// uninterrupted run's.
TEST_F(DataSplit, AStoppedRunTestsWhenItsLastStepIsDone) {
  const std::string data = "train_prefix: " + e() + ", split: '8,1,1'";
  const std::vector<double> full = values_of(train("full", data, {}), "test_loss");
  EXPECT_TRUE(values_of(train("stopped", data, {"train.exit_interval=5"}), "test_loss").empty());
  EXPECT_EQ(values_of(train("stopped", data, {"train.resume=true"}), "test_loss"), full);
}

TEST_F(DataSplit, APartTooSmallToReadNamesTheSplit) {
  const int64_t sequences = data::IndexedDataset::open(d()).num_sequences();
  try {
    train("tiny-part", "train_prefix: " + d() + ", split: '1000,1,1'", {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("data.split = 1000,1,1 gives the validation part sequences [" + std::to_string(sequences) +
                           ", " + std::to_string(sequences) + "): dataset '" + d() + "''s sequences"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("have 0 tokens; seq_len 16 needs at least 17"), std::string::npos) << message;
    EXPECT_NE(message.find("give that part a larger share (or 0 for none)"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace loom::train
