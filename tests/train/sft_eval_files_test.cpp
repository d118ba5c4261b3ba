// SFT's validation and test conversations of their own (sft.val_files, sft.test_files; NeMo's
// validation_ds and test_ds): evaluating them leaves training bit for bit as it was; the test set
// is evaluated once, after the last step, exactly as the validation set is (the same files give
// the same loss); other files give another loss; data-parallel and tensor-parallel ranks evaluate
// both as one rank does; a held-out share beside val_files, an empty file and a missing one, and
// the pre-training data keys loom sft does not read are refused naming the key; train.skip_train evaluates a checkpoint on both files as its run did.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/train/sft.h"
#include "sft_files.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class SftEvalFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::temp_directory_path() / ("loom-sft-eval-files-" + std::to_string(::getpid()))).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    testing::write_conversations(root_ + "/train.jsonl", "alpha", 24);
    testing::write_conversations(root_ + "/val.jsonl", "beta", 12);
    testing::write_conversations(root_ + "/test.jsonl", "gamma", 8);
    std::ofstream(root_ + "/empty.jsonl") << "";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string file(const std::string& name) { return root_ + "/" + name + ".jsonl"; }

  static config::RunConfig config(const std::string& name, const std::vector<std::string>& overrides) {
    return testing::sft_test_config(root_, name, "{train_files: [" + file("train") + "], val_fraction: 0}", overrides);
  }

  static std::vector<nlohmann::json> train(const std::string& name, const std::vector<std::string>& overrides,
                                           std::string* console = nullptr) {
    return testing::sft_run(config(name, overrides), console);
  }

  static std::string error_of(const std::vector<std::string>& overrides) {
    try {
      train("refused", overrides);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  static std::string root_;
};
std::string SftEvalFiles::root_;

TEST_F(SftEvalFiles, ValidationFilesAreEvaluatedAndLeaveTrainingAsItWas) {
  const std::vector<nlohmann::json> plain = train("plain", {});
  std::string console;
  const std::vector<nlohmann::json> validated = train("validated", {"sft.val_files=[" + file("val") + "]"}, &console);
  ASSERT_EQ(plain.size(), 4u);
  ASSERT_EQ(validated.size(), 4u);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(validated[i].at("loss").get<double>(), plain[i].at("loss").get<double>()) << "step " << i + 1;
    EXPECT_FALSE(plain[i].contains("val_loss")) << "step " << i + 1;
    EXPECT_EQ(validated[i].contains("val_loss"), i % 2 == 1) << "step " << i + 1;
    EXPECT_FALSE(validated[i].contains("test_loss")) << "step " << i + 1;
  }
  EXPECT_EQ(ckpt::parameter_digest(root_ + "/validated/checkpoints"),
            ckpt::parameter_digest(root_ + "/plain/checkpoints"));
  EXPECT_NE(console.find("sft: validation (sft.val_files): 12 conversations"), std::string::npos) << console;
  EXPECT_NE(console.find("evaluation: "), std::string::npos) << console;
}

TEST_F(SftEvalFiles, TheTestSetIsEvaluatedAfterTheLastStepAsTheValidationSetIs) {
  std::string console;
  const std::vector<nlohmann::json> same =
      train("same", {"sft.val_files=[" + file("val") + "]", "sft.test_files=[" + file("val") + "]"}, &console);
  ASSERT_EQ(same.size(), 4u);
  for (size_t i = 0; i + 1 < same.size(); ++i) EXPECT_FALSE(same[i].contains("test_loss")) << "step " << i + 1;
  const double val_loss = same.back().at("val_loss").get<double>();
  EXPECT_EQ(same.back().at("test_loss").get<double>(), val_loss);
  EXPECT_NE(console.find("sft: test (sft.test_files): 12 conversations"), std::string::npos) << console;
  EXPECT_NE(console.find("step 4: test_loss "), std::string::npos) << console;

  const std::vector<nlohmann::json> other =
      train("other", {"sft.val_files=[" + file("val") + "]", "sft.test_files=[" + file("test") + "]"});
  EXPECT_EQ(other.back().at("val_loss").get<double>(), val_loss);
  EXPECT_GT(std::abs(other.back().at("test_loss").get<double>() - val_loss), 1e-3 * val_loss);
}

TEST_F(SftEvalFiles, ParallelRanksEvaluateBothSetsAsOneRank) {
  const std::vector<std::string> files = {"sft.val_files=[" + file("val") + "]",
                                          "sft.test_files=[" + file("test") + "]"};
  const std::vector<nlohmann::json> one = train("one", files);
  for (const std::string layout : {"runtime.ranks=2", "parallel.tp=2"}) {
    std::vector<std::string> overrides = files;
    overrides.push_back(layout);
    if (layout == "parallel.tp=2") overrides.push_back("runtime.ranks=2");
    const std::vector<nlohmann::json> two = train(layout == "parallel.tp=2" ? "tp2" : "dp2", overrides);
    ASSERT_EQ(two.size(), one.size()) << layout;
    for (const char* key : {"val_loss", "test_loss"}) {
      const double expected = one.back().at(key).get<double>();
      EXPECT_NEAR(two.back().at(key).get<double>(), expected, 1e-5 * expected) << layout << " " << key;
    }
  }
}

TEST_F(SftEvalFiles, ACheckpointEvaluatesOnBothFilesWithoutTraining) {
  const std::vector<std::string> files = {"sft.val_files=[" + file("val") + "]",
                                          "sft.test_files=[" + file("test") + "]"};
  const std::vector<nlohmann::json> trained = train("trained", files);
  std::vector<std::string> overrides = files;
  overrides.push_back("train.init_from=" + root_ + "/trained/checkpoints");
  overrides.push_back("train.skip_train=true");
  std::ostringstream out;
  const TrainSummary s = sft(config("evaluated", overrides), out);
  EXPECT_TRUE(s.evaluated_only);
  ASSERT_TRUE(s.last_val_loss && s.test_loss);
  EXPECT_EQ(*s.last_val_loss, trained.back().at("val_loss").get<double>());
  EXPECT_EQ(*s.test_loss, trained.back().at("test_loss").get<double>());
  EXPECT_FALSE(fs::exists(root_ + "/evaluated/metrics.jsonl"));
}

TEST_F(SftEvalFiles, BadFilesAndAHeldOutShareBesideThemAreRefusedByKey) {
  const std::string share = error_of({"sft.val_files=[" + file("val") + "]", "sft.val_fraction=0.1"});
  EXPECT_NE(share.find("sft.val_files names the validation conversations, and sft.val_fraction = 0.1"),
            std::string::npos)
      << share;
  EXPECT_NE(share.find("set sft.val_fraction=0"), std::string::npos) << share;
  const std::string empty = error_of({"sft.test_files=[" + file("empty") + "]"});
  EXPECT_NE(empty.find("sft.test_files has no conversations"), std::string::npos) << empty;
  for (const std::string key : {"data.val_prefix", "data.test_prefix"}) {
    const std::string unread = error_of({key + "=" + root_ + "/data"});
    EXPECT_EQ(unread.rfind(key + " is set, and loom sft does not read it", 0), 0u) << unread;
  }
  const std::string split = error_of({"data.split=98,1,1"});
  EXPECT_EQ(split.rfind("data.split is set, and loom sft does not read it", 0), 0u) << split;
  const std::string missing = error_of({"sft.val_files=[" + root_ + "/missing.jsonl]"});
  EXPECT_EQ(missing.rfind("sft.val_files: ", 0), 0u) << missing;
  EXPECT_NE(missing.find(root_ + "/missing.jsonl"), std::string::npos) << missing;
}

}  // namespace
}  // namespace loom::train
