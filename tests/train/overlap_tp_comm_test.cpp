// parallel.overlap_tp_comm: the column-parallel layers' backward collectives run beside their
// GEMMs. Over simulated links slow enough that they are still in flight when the GEMMs end
// (topology.simulate), a run trains bit for bit as with every collective waited for where it
// starts: losses, evaluations and every tensor of the checkpoints, at tp 2 with and without
// sequence parallelism, beside data parallelism with ZeRO-1, and with recompute. Each step reports
// the seconds it waited for its tensor-parallel collectives (tp_comm_wait_s).
#include <gtest/gtest.h>

#include <filesystem>

#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class OverlapTpComm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("overlap-tp-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  std::vector<nlohmann::json> train(const std::string& name, std::vector<std::string> overrides) {
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 3, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n" +
        testing::data_section(root_) +
        "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
        "train: {steps: 4, global_batch: 4, micro_batch: 2, threads: 1, eval_batches: 2, eval_interval: 2}\n"
        "checkpoint: {interval: 4}\n"
        "log: {progress: false, interval: 100}\n";
    overrides.insert(overrides.end(), {"data.val_prefix=" + root_ + "/data/c_train", "topology.simulate=true",
                                       "topology.ranks_per_node=2", "topology.node_latency_us=200",
                                       "topology.node_bandwidth_gbps=0.5"});
    return testing::train_run(root_, name, yaml, overrides);
  }

  // Trains `overrides` with the collectives waited for where they start and overlapped; expects
  // the same losses, validation losses and checkpoint tensors bit for bit, and every step's wait.
  void expect_overlap_changes_nothing(const std::string& name, const std::vector<std::string>& overrides) {
    SCOPED_TRACE(name);
    std::vector<std::string> waited = overrides;
    waited.push_back("parallel.overlap_tp_comm=false");
    const std::vector<nlohmann::json> waiting = train(name + "-waited", waited);
    const std::vector<nlohmann::json> overlapping = train(name + "-overlapped", overrides);
    ASSERT_EQ(waiting.size(), overlapping.size());
    ASSERT_FALSE(waiting.empty());
    for (size_t i = 0; i < waiting.size(); ++i) {
      EXPECT_EQ(waiting[i].at("loss").get<double>(), overlapping[i].at("loss").get<double>()) << "step " << i + 1;
      EXPECT_EQ(waiting[i].value("val_loss", 0.0), overlapping[i].value("val_loss", 0.0)) << "step " << i + 1;
      // The forward's sums cannot be hidden, and each transfer over these links takes time.
      for (const nlohmann::json* r : {&waiting[i], &overlapping[i]}) {
        ASSERT_TRUE(r->contains("tp_comm_wait_s")) << r->dump();
        EXPECT_GT(r->at("tp_comm_wait_s").get<double>(), 0.0) << r->dump();
      }
    }
    const double difference = testing::checkpoint_difference(
        root_, name + "-waited", name + "-overlapped", [](const ckpt::LoadedCheckpoint& c) { return c.names(); });
    EXPECT_EQ(difference, 0.0);
  }

  static std::string root_;
};
std::string OverlapTpComm::root_;

TEST_F(OverlapTpComm, TensorParallelRunsTrainAsWithEveryCollectiveWaitedFor) {
  expect_overlap_changes_nothing("tp2", {"runtime.ranks=2", "parallel.tp=2"});
  expect_overlap_changes_nothing("tp2-sp", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"});
  expect_overlap_changes_nothing("tp2-sp-dp2-zero1-recompute",
                                 {"runtime.ranks=4", "parallel.tp=2", "parallel.sequence_parallel=true",
                                  "parallel.zero=1", "model.recompute=true"});
}

// One tensor-parallel rank has no such collectives, and reports no wait.
TEST_F(OverlapTpComm, OneTensorParallelRankReportsNoWait) {
  const std::vector<nlohmann::json> records = train("tp1", {"runtime.ranks=2"});
  ASSERT_FALSE(records.empty());
  for (const nlohmann::json& r : records) EXPECT_FALSE(r.contains("tp_comm_wait_s")) << r.dump();
}

}  // namespace
}  // namespace loom::train
