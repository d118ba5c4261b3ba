// Checkpoints load into any layout: every rank writes its own shards, and a run saved at (dp 2, tp 2, ZeRO-1) continues at tp 1,
// pp 2 x dp 2, tp 4 and dp 4 with ZeRO-3, and runs saved at each of those continue at
// (dp 2, tp 2, ZeRO-1); the next 10 steps' losses equal the uninterrupted run's (relative 1e-5).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

const char* kModel =
    "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 4, ffn_size: 64, max_seq_len: 32}\n";

class Reshard : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("reshard-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  std::vector<double> train(const std::string& name, std::vector<std::string> overrides) {
    const std::string yaml = std::string(kModel) + testing::data_section(root_) +
                             "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
                             "train: {steps: 20, global_batch: 8, micro_batch: 2, threads: 1}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::losses_of(testing::train_run(root_, name, yaml, overrides));
  }

  // Trains 10 steps at `from`, then the remaining 10 at `to` from the checkpoint.
  std::vector<double> continued(const std::string& name, std::vector<std::string> from, std::vector<std::string> to) {
    from.push_back("train.exit_interval=10");
    train(name, from);
    fs::remove(root_ + "/" + name + "/metrics.jsonl");
    to.push_back("train.resume=true");
    return train(name, to);
  }

  static std::string root_;
};
std::string Reshard::root_;

TEST_F(Reshard, SavedLayoutLoadsIntoEveryOtherAndBack) {
  const std::vector<std::string> saved = {"runtime.ranks=4", "parallel.tp=2", "parallel.zero=1"};
  const std::vector<double> full = train("full", saved);
  ASSERT_EQ(full.size(), 20u);
  // Every rank wrote its own shards: four data files, each holding some of the tensors.
  const ckpt::LoadedCheckpoint written = ckpt::load_checkpoint(root_ + "/full/checkpoints");
  ASSERT_EQ(written.manifest().files.size(), 4u);
  std::map<std::string, int> shards_per_file;
  for (const ckpt::TensorRecord& t : written.manifest().tensors) {
    for (const ckpt::ShardRecord& shard : t.shards) ++shards_per_file[shard.file];
  }
  EXPECT_EQ(shards_per_file.size(), 4u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"tp1", {"runtime.ranks=1"}},
      {"pp2-dp2", {"runtime.ranks=4", "parallel.pp=2"}},
      {"tp4", {"runtime.ranks=4", "parallel.tp=4"}},
      {"dp4-zero3", {"runtime.ranks=4", "parallel.zero=3"}},
  };
  for (const auto& [name, layout] : layouts) {
    {
      SCOPED_TRACE("to " + name);
      testing::expect_same_losses(full, continued("to-" + name, saved, layout), 10);
    }
    {
      SCOPED_TRACE("back from " + name);
      testing::expect_same_losses(full, continued("from-" + name, layout, saved), 10);
    }
  }
}

}  // namespace
}  // namespace loom::train
