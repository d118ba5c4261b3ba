// train.skip_train (Megatron's --skip-train): a model as train.resume or train.init_from loads it,
// evaluated once on the validation and test sets without training. Evaluating a finished run gives
// the losses its last step recorded, bit for bit, and leaves its files as they were (a run.dir of
// another run is neither refused nor deleted); a checkpoint evaluates in a fresh run.dir, and in
// dp 2, tp 2 and pp 2 as on one rank; a run without a validation or test set is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
#include "loom/train/pretrain.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class SkipTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::make_training_root("skip-train");
    // 200 documents (sequences) to split 8,1,1.
    std::string lines;
    for (int i = 0; i < 200; ++i) {
      lines += R"({"text": "It is a truth universally acknowledged, item )" + std::to_string(i * 7) + ".\"}\n";
    }
    std::ofstream(root_ + "/e.jsonl") << lines;
    data::prepare_dataset({root_ + "/e.jsonl"}, *data::make_tokenizer("byte"), root_ + "/data/e", 0.0, 1);
    trained_ = testing::train_run(root_, "run", yaml(), {});
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string yaml() {
    return "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
           "data: {tokenizer: byte, seq_len: 16, train_prefix: " + root_ + "/data/e_train, split: '8,1,1'}\n"
           "optim: {lr: 1.0e-3, warmup_steps: 2}\n"
           "train: {steps: 8, global_batch: 8, micro_batch: 4, threads: 1, eval_interval: 4, eval_batches: 2}\n"
           "log: {progress: false, interval: 100}\n";
  }

  static TrainSummary evaluate(const std::string& name, std::vector<std::string> overrides,
                               std::string* console = nullptr) {
    overrides.push_back("train.skip_train=true");
    const config::RunConfig config =
        config::parse_config("run: {dir: " + root_ + "/" + name + "}\n" + yaml(), name, overrides);
    std::ostringstream out;
    TrainSummary summary = pretrain(config, out);
    if (console != nullptr) *console = out.str();
    return summary;
  }

  // Every file under root_/name with its size and contents.
  static std::set<std::string> files_of(const std::string& name) {
    std::set<std::string> files;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(root_ + "/" + name)) {
      if (!entry.is_regular_file() || entry.path().filename() == "loom.lock") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream bytes;
      bytes << in.rdbuf();
      files.insert(entry.path().string() + " " + bytes.str());
    }
    return files;
  }

  static double last(const char* key) { return trained_.back().at(key).get<double>(); }

  static std::string root_;
  static std::vector<nlohmann::json> trained_;
};
std::string SkipTrain::root_;
std::vector<nlohmann::json> SkipTrain::trained_;

TEST_F(SkipTrain, AFinishedRunEvaluatesToItsLastLossesAndKeepsItsFiles) {
  ASSERT_EQ(trained_.size(), 8u);
  const std::set<std::string> before = files_of("run");
  std::string console;
  // A shorter train.steps than the checkpoint's is no error here: it evaluates where it is.
  const TrainSummary s = evaluate("run", {"train.resume=true", "train.steps=4"}, &console);
  EXPECT_TRUE(s.evaluated_only);
  EXPECT_EQ(s.last_step, 8);
  EXPECT_EQ(s.steps_run, 0);
  ASSERT_TRUE(s.last_val_loss && s.test_loss);
  EXPECT_EQ(*s.last_val_loss, last("val_loss"));
  EXPECT_EQ(*s.test_loss, last("test_loss"));
  EXPECT_EQ(files_of("run"), before);
  EXPECT_NE(console.find("evaluation only (train.skip_train): 2 micro-batches of "), std::string::npos) << console;
}

TEST_F(SkipTrain, AnotherRunsDirectoryIsNeitherRefusedNorDeleted) {
  const std::set<std::string> before = files_of("run");
  const TrainSummary s = evaluate("run", {"train.init_from=" + root_ + "/run/checkpoints", "run.overwrite=true"});
  EXPECT_EQ(*s.test_loss, last("test_loss"));
  EXPECT_EQ(s.last_step, 0);  // init_from: the parameters at step 0
  EXPECT_EQ(files_of("run"), before);
}

TEST_F(SkipTrain, ACheckpointEvaluatesInAFreshDirectoryAndEveryLayoutAsOneRank) {
  const std::string from = "train.init_from=" + root_ + "/run/checkpoints";
  const TrainSummary one = evaluate("fresh", {from});
  EXPECT_EQ(*one.last_val_loss, last("val_loss"));
  EXPECT_EQ(*one.test_loss, last("test_loss"));
  EXPECT_FALSE(fs::exists(root_ + "/fresh/metrics.jsonl"));
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"runtime.ranks=2"}, std::vector<std::string>{"runtime.ranks=2", "parallel.tp=2"},
        std::vector<std::string>{"runtime.ranks=2", "parallel.pp=2"}}) {
    std::vector<std::string> overrides = layout;
    overrides.push_back(from);
    const TrainSummary two = evaluate("layout-" + layout.back(), overrides);
    EXPECT_NEAR(*two.last_val_loss, last("val_loss"), 1e-5 * last("val_loss")) << layout.back();
    EXPECT_NEAR(*two.test_loss, last("test_loss"), 1e-5 * last("test_loss")) << layout.back();
  }
  // Another model evaluates to another loss: the numbers come from the loaded parameters.
  const TrainSummary untrained = evaluate("untrained", {});
  EXPECT_GT(*untrained.test_loss - last("test_loss"), 0.1);
}

TEST_F(SkipTrain, ARunWithoutValidationOrTestSetIsRefused) {
  try {
    evaluate("nothing", {"data.split=100,0,0", "train.init_from=" + root_ + "/run/checkpoints"});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.skip_train evaluates the validation and test sets, and this run has "
                                         "neither"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::train
