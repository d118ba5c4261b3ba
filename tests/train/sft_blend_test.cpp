// SFT on a weighted blend of conversation files (sft.train_weights): each global sample is the
// row of the file the blend picks for it, at that file's own next sample; a blend of one file
// trains bit for bit as the file alone; two data-parallel ranks train a blend as one rank does
// (every step's loss and the final parameters and moments, fp32: relative 1e-5); validation
// blends the files' held-out rows; a resumed blend continues bit for bit; the run reports each
// file and the blend's shares; a file without conversations is named by its entry.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/blend_index.h"
#include "loom/data/chat/chat_dataset.h"
#include "loom/train/blended_source.h"
#include "loom/train/sft.h"
#include "loom/train/sft_source.h"
#include "sft_files.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using testing::write_conversations;

class SftBlend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::temp_directory_path() / ("loom-sft-blend-" + std::to_string(::getpid()))).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    write_conversations(root_ + "/a.jsonl", "alpha", 24);
    write_conversations(root_ + "/b.jsonl", "beta", 12);
    std::ofstream(root_ + "/empty.jsonl") << "";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static config::RunConfig config(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string sft = "{train_files: [" + root_ + "/a.jsonl, " + root_ + "/b.jsonl], val_fraction: 0.25}";
    return testing::sft_test_config(root_, name, sft, overrides);
  }

  static std::vector<nlohmann::json> train(const std::string& name, const std::vector<std::string>& overrides,
                                           std::string* console = nullptr) {
    return testing::sft_run(config(name, overrides), console);
  }
  static std::string digest(const std::string& name) {
    return ckpt::parameter_digest(root_ + "/" + name + "/checkpoints");
  }

  static std::string root_;
};
std::string SftBlend::root_;

TEST_F(SftBlend, EachRowIsTheRowOfTheFileThePickNames) {
  std::vector<data::TokenizedConversation> a, b;
  for (int d = 0; d < 30; ++d) {
    data::TokenizedConversation doc;
    for (int k = 0; k < 5 + d % 9; ++k) {
      doc.tokens.push_back(static_cast<int32_t>(philox4x32(3, d, k)[0] % 256));
      doc.trained.push_back(k % 2);
    }
    (d < 20 ? a : b).push_back(doc);
  }
  const data::ChatRows rows_a = data::make_rows(a, 16, true, 0), rows_b = data::make_rows(b, 16, true, 0);
  std::vector<BlendedSource::Part> parts;
  parts.push_back({"a", 0.6, std::make_unique<SftSource>(rows_a, 1, true, "a")});
  parts.push_back({"b", 0.4, std::make_unique<SftSource>(rows_b, 2, true, "b")});
  const BlendedSource blend(std::move(parts));
  const SftSource alone_a(rows_a, 1, true, "a"), alone_b(rows_b, 2, true, "b");
  TokenBatch batch, one;
  batch.resize(40, 16);
  blend.fill(13, batch);
  const std::vector<data::BlendIndex::Pick> picks = data::BlendIndex({0.6, 0.4}).picks(13, 40);
  for (int r = 0; r < 40; ++r) {
    one.resize(1, 16);
    (picks[r].dataset == 0 ? alone_a : alone_b).fill(picks[r].sample, one);
    for (int t = 0; t < 16; ++t) {
      const size_t i = static_cast<size_t>(r) * 16 + t;
      ASSERT_EQ(batch.inputs[i], one.inputs[t]) << "row " << r;
      ASSERT_EQ(batch.targets[i], one.targets[t]) << "row " << r;
      ASSERT_EQ(batch.loss_weights[i], one.loss_weights[t]) << "row " << r;
      ASSERT_EQ(batch.positions[i], one.positions[t]) << "row " << r;
      ASSERT_EQ(batch.documents[i], one.documents[t]) << "row " << r;
    }
  }
}

TEST_F(SftBlend, ABlendOfOneFileTrainsAsTheFileAlone) {
  const std::string a = "sft.train_files=[" + root_ + "/a.jsonl]";
  const std::vector<nlohmann::json> alone = train("alone", {a});
  const std::vector<nlohmann::json> blended = train("blend-of-one", {a, "sft.train_weights=[2.5]"});
  ASSERT_EQ(blended.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(blended[i].at("loss").get<double>(), alone[i].at("loss").get<double>()) << "step " << i + 1;
    EXPECT_EQ(blended[i].contains("val_loss"), alone[i].contains("val_loss"));
    if (alone[i].contains("val_loss")) {
      EXPECT_EQ(blended[i].at("val_loss"), alone[i].at("val_loss"));
    }
  }
  EXPECT_EQ(digest("blend-of-one"), digest("alone"));
}

TEST_F(SftBlend, DataParallelRanksTrainABlendAsOneRankAndTheRunSaysWhatItReads) {
  std::string console;
  const std::vector<nlohmann::json> one = train("one", {"sft.train_weights=[3, 1]"}, &console);
  ASSERT_EQ(one.size(), 4u);
  EXPECT_NE(console.find("sft: dataset 1 of the blend: " + root_ + "/b.jsonl (weight 1)"), std::string::npos)
      << console;
  EXPECT_NE(console.find("data: blend of 2 datasets; samples [0, 32) read " + root_ + "/a.jsonl (train split) 75.0% "
                         "(24 samples"),
            std::string::npos)
      << console;
  EXPECT_TRUE(one[1].contains("val_loss"));
  const std::vector<nlohmann::json> two = train("two", {"sft.train_weights=[3, 1]", "runtime.ranks=2"});
  testing::expect_same_losses(testing::losses_of(one), testing::losses_of(two));
  EXPECT_NEAR(two[1].at("val_loss").get<double>(), one[1].at("val_loss").get<double>(),
              1e-5 * one[1].at("val_loss").get<double>());
  EXPECT_LE(testing::state_difference(root_, "one", "two"), 1e-5);
}

TEST_F(SftBlend, AFileAloneSaysHowManyEpochsTheRunReads) {
  std::string console;
  train("alone-b", {"sft.train_files=[" + root_ + "/b.jsonl]", "train.steps=3"}, &console);
  // 12 conversations, 2 held out: 10 rows; 3 steps of 8 read 24 of them.
  EXPECT_NE(console.find("data: sft.train_files (train split): 10 rows of 128 tokens per epoch; samples [0, 24) read "
                         "2.4 epochs"),
            std::string::npos)
      << console;
}

TEST_F(SftBlend, AResumedBlendContinuesBitForBit) {
  train("whole", {"sft.train_weights=[3, 1]"});
  train("halves", {"sft.train_weights=[3, 1]", "train.exit_interval=2"});
  train("halves", {"sft.train_weights=[3, 1]", "train.resume=true"});
  EXPECT_EQ(digest("halves"), digest("whole"));
}

TEST_F(SftBlend, AFileWithoutConversationsIsNamedByItsEntry) {
  try {
    train("empty", {"sft.train_files=[" + root_ + "/a.jsonl, " + root_ + "/empty.jsonl]", "sft.train_weights=[1, 1]"});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sft.train_files[1] = '" + root_ + "/empty.jsonl': "), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::train
