// train.rampup_batch_size and train.samples in training (threads backend): a ramped run trains
// bit for bit as the runs of its batches one after another (each resuming the last one's
// checkpoint); data, zero-3, tensor + sequence, 1F1B and interleaved pipeline, and context
// parallel ranks ramp as one rank does (every step's loss and the final parameters and moments,
// fp32: relative 1e-5); a run resumed mid-ramp continues bit for bit; a run measured in samples
// takes Megatron's steps at its samples' learning rates, and one of whole batches trains as the
// run of its steps; layouts that cannot split the ramp's batches are errors naming the keys.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/optim/schedule.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// Batches 4, 4, 8, 12 while the ramp-up's 24 samples last (stages of 8 samples), then 16.
const char* kRun =
    "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
    "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
    "train: {steps: 8, global_batch: 16, micro_batch: 2, threads: 1, rampup_batch_size: [4, 4, 24]}\n"
    "log: {progress: false, interval: 100}\n";

class BatchRampupTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("rampup-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  std::vector<nlohmann::json> train(const std::string& name, const std::vector<std::string>& overrides,
                                    std::string* console = nullptr) {
    return testing::train_run(root_, name, std::string(kRun) + testing::data_section(root_), overrides, console);
  }
  std::string digest(const std::string& name) { return ckpt::parameter_digest(root_ + "/" + name + "/checkpoints"); }

  static std::string root_;
};
std::string BatchRampupTraining::root_;

TEST_F(BatchRampupTraining, TrainsAsTheRunsOfItsBatchesOneAfterAnother) {
  std::string console;
  const std::vector<nlohmann::json> ramped = train("ramped", {}, &console);
  EXPECT_EQ(testing::column<int64_t>(ramped, "global_batch"), (std::vector<int64_t>{4, 4, 8, 12, 16, 16, 16, 16}));
  EXPECT_EQ(testing::column<int64_t>(ramped, "consumed_samples"), (std::vector<int64_t>{4, 8, 16, 28, 44, 60, 76, 92}));
  EXPECT_NE(console.find("x 2 to 8 micro-batches of 2 x 16 tokens per step"), std::string::npos) << console;
  EXPECT_NE(console.find("batch: ramps up from 4 to 16 sequences by 4 over the first 24 samples (steps 1-4), then 16"),
            std::string::npos)
      << console;

  // The same batches from constant-batch runs, each resuming the one before.
  const std::vector<std::string> no_ramp = {"train.rampup_batch_size=[]", "train.resume=true"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), no_ramp.begin(), no_ramp.end());
    return more;
  };
  train("chained", with({"train.global_batch=4", "train.exit_interval=2"}));
  train("chained", with({"train.global_batch=8", "train.exit_interval=1"}));
  train("chained", with({"train.global_batch=12", "train.exit_interval=1"}));
  const std::vector<nlohmann::json> chained = train("chained", with({"train.global_batch=16"}));
  ASSERT_EQ(chained.size(), ramped.size());
  for (size_t i = 0; i < ramped.size(); ++i) {
    EXPECT_EQ(chained[i].at("loss").get<double>(), ramped[i].at("loss").get<double>()) << "step " << i + 1;
    EXPECT_EQ(chained[i].at("lr").get<double>(), ramped[i].at("lr").get<double>()) << "step " << i + 1;
  }
  EXPECT_EQ(testing::column<int64_t>(chained, "consumed_samples"),
            testing::column<int64_t>(ramped, "consumed_samples"));
  EXPECT_EQ(digest("chained"), digest("ramped"));
}

TEST_F(BatchRampupTraining, EveryLayoutRampsAsOneRank) {
  const std::vector<double> one = testing::losses_of(train("one", {}));
  ASSERT_EQ(one.size(), 8u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"dp2", {"runtime.ranks=2"}},
      {"zero3", {"runtime.ranks=2", "parallel.zero=3"}},
      {"tp2-sp", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2-1f1b", {"runtime.ranks=2", "parallel.pp=2"}},
      {"pp2-interleaved",
       {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=interleaved", "parallel.virtual_stages=2"}},
      {"cp2", {"runtime.ranks=2", "parallel.cp=2"}},
  };
  for (const auto& [name, overrides] : layouts) {
    SCOPED_TRACE(name);
    testing::expect_same_losses(one, testing::losses_of(train(name, overrides)));
    EXPECT_LE(testing::state_difference(root_, "one", name), 1e-5);
  }
}

TEST_F(BatchRampupTraining, AResumedRunContinuesMidRampBitForBit) {
  train("full", {});
  train("split", {"train.exit_interval=3"});
  const std::vector<nlohmann::json> resumed = train("split", {"train.resume=true"});
  EXPECT_EQ(testing::column<int64_t>(resumed, "global_batch"), (std::vector<int64_t>{4, 4, 8, 12, 16, 16, 16, 16}));
  EXPECT_EQ(digest("split"), digest("full"));
}

TEST_F(BatchRampupTraining, ARunOfSamplesTakesMegatronsStepsAtItsSamplesLearningRates) {
  // While a step starts within the 24 ramp-up samples: 4, 4, 8, 12 (28 consumed); then the whole
  // batches of 16 left of 80: 3.
  const std::vector<std::string> samples = {"train.steps=0", "train.samples=80", "optim.warmup_steps=0",
                                            "optim.warmup_samples=12", "optim.schedule=linear"};
  std::string console;
  const std::vector<nlohmann::json> records = train("samples", samples, &console);
  EXPECT_EQ(testing::column<int64_t>(records, "global_batch"), (std::vector<int64_t>{4, 4, 8, 12, 16, 16, 16}));
  const config::RunConfig config = config::parse_config(std::string(kRun) + testing::data_section(root_), "", samples);
  for (const nlohmann::json& r : records) {
    const int64_t consumed = r.at("consumed_samples").get<int64_t>();
    EXPECT_DOUBLE_EQ(r.at("lr").get<double>(),
                     optim::learning_rate(config.optim, consumed, 80, optim::ScheduleUnit::Samples))
        << "after " << consumed << " samples";
  }
  EXPECT_DOUBLE_EQ(records[0].at("lr").get<double>(), 1.0e-3 * 4.0 / 12.0);  // warming up over 12 samples
  const double min_lr = config.optim.min_lr;  // decaying linearly over samples 12..80
  EXPECT_DOUBLE_EQ(records[2].at("lr").get<double>(),
                   min_lr + (1.0e-3 - min_lr) * (1.0 - (16.0 - 12.0) / (80.0 - 12.0)));
}

TEST_F(BatchRampupTraining, ASampleRunOfWholeBatchesTrainsAsTheRunOfItsSteps) {
  const std::vector<std::string> constant = {"train.rampup_batch_size=[]", "optim.schedule=wsd"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), constant.begin(), constant.end());
    return more;
  };
  const std::vector<nlohmann::json> steps = train("by-steps", with({"optim.wsd_decay_steps=3"}));
  const std::vector<nlohmann::json> samples =
      train("by-samples", with({"train.steps=0", "train.samples=128", "optim.warmup_steps=0", "optim.warmup_samples=32",
                                "optim.wsd_decay_samples=48"}));
  ASSERT_EQ(samples.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(samples[i].at("lr").get<double>(), steps[i].at("lr").get<double>()) << "step " << i + 1;
    EXPECT_EQ(samples[i].at("loss").get<double>(), steps[i].at("loss").get<double>()) << "step " << i + 1;
  }
  EXPECT_EQ(digest("by-samples"), digest("by-steps"));
}

TEST_F(BatchRampupTraining, LayoutsThatCannotSplitTheRampsBatchesAreRefused) {
  auto error_of = [&](const std::vector<std::string>& overrides) {
    try {
      train("refused", overrides);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of({"runtime.ranks=2", "train.rampup_batch_size=[2, 2, 24]"})
                .find("train.rampup_batch_size = [2, 2, 24]: each batch of the ramp-up must be a multiple of "
                      "train.micro_batch 2 x data-parallel ranks 2 = 4, so its start and increment must be"),
            std::string::npos);
  EXPECT_NE(error_of({"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=interleaved",
                      "parallel.virtual_stages=2", "train.rampup_batch_size=[4, 2, 24]"})
                .find("x parallel.pp 2 (the interleaved schedule's rounds) = 4"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::train
