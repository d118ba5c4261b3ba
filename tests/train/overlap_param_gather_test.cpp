// parallel.overlap_param_gather: ZeRO 1-2 leave the update's parameter all-gathers in flight and
// each unit's forward waits for its own buckets. Over links slow enough that the gathers are
// still in flight when the next forward starts (topology.simulate: every rank a node of its own),
// a run trains bit for bit as with the gathers waited for inside the update: losses, evaluations
// between update and forward, and every tensor of the checkpoints, at ZeRO 1 and 2, with bf16
// parameters, with a pipeline, tensor parallelism, two sites, across a resume and under DiLoCo.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/error.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class OverlapParamGather : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("overlap-gather-test"); }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  std::vector<nlohmann::json> train(const std::string& name, std::vector<std::string> overrides) {
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 3, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n" +
        testing::data_section(root_) +
        "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
        "train: {steps: 6, global_batch: 8, micro_batch: 2, threads: 1, eval_batches: 2, eval_interval: 2}\n"
        "checkpoint: {interval: 3}\n"
        "log: {progress: false, interval: 100}\n";
    overrides.insert(overrides.end(), {"data.val_prefix=" + root_ + "/data/c_train", "parallel.bucket_mb=0.004",
                                       "topology.simulate=true", "topology.ranks_per_node=1",
                                       "topology.site_latency_us=3000", "topology.site_bandwidth_gbps=0.2"});
    return testing::train_run(root_, name, yaml, overrides);
  }

  // Trains `overrides` with the gathers waited for in the update and overlapped with the forward;
  // expects the same losses, validation losses and checkpoint tensors bit for bit.
  void expect_overlap_changes_nothing(const std::string& name, const std::vector<std::string>& overrides) {
    SCOPED_TRACE(name);
    const std::vector<nlohmann::json> blocking = train(name + "-blocking", overrides);
    std::vector<std::string> overlapped = overrides;
    overlapped.push_back("parallel.overlap_param_gather=true");
    const std::vector<nlohmann::json> overlapping = train(name + "-overlapped", overlapped);
    ASSERT_EQ(blocking.size(), overlapping.size());
    for (size_t i = 0; i < blocking.size(); ++i) {
      EXPECT_EQ(blocking[i].at("loss").get<double>(), overlapping[i].at("loss").get<double>()) << "step " << i + 1;
      EXPECT_EQ(blocking[i].value("val_loss", 0.0), overlapping[i].value("val_loss", 0.0)) << "step " << i + 1;
    }
    const double difference = testing::checkpoint_difference(
        root_, name + "-blocking", name + "-overlapped", [](const ckpt::LoadedCheckpoint& c) { return c.names(); });
    EXPECT_EQ(difference, 0.0);
  }

  static std::string root_;
};
std::string OverlapParamGather::root_;

TEST_F(OverlapParamGather, Zero1And2TrainAsWithTheGathersInTheUpdate) {
  for (int zero : {1, 2}) {
    expect_overlap_changes_nothing("zero" + std::to_string(zero),
                                   {"runtime.ranks=2", "parallel.zero=" + std::to_string(zero)});
  }
}

// bf16 parameters in a compact store, gathered in bf16 and widened unit by unit after the wait.
TEST_F(OverlapParamGather, CompactBf16ParametersTrainAsWithTheGathersInTheUpdate) {
  expect_overlap_changes_nothing("zero1-bf16", {"runtime.ranks=2", "parallel.zero=1", "precision.recipe=bf16",
                                                "precision.param_dtype=compute"});
}

// Two stages, each with its own data-parallel pair and buckets; four ranks, tp 2 beside dp 2.
TEST_F(OverlapParamGather, PipelineAndTensorParallelLayoutsTrainAsWithTheGathersInTheUpdate) {
  expect_overlap_changes_nothing("zero1-pp2", {"runtime.ranks=4", "parallel.pp=2", "parallel.zero=1"});
  expect_overlap_changes_nothing("zero2-tp2", {"runtime.ranks=4", "parallel.tp=2", "parallel.zero=2"});
}

// Two sites of two ranks: the optimizer sharded inside each site, the gathers on a group split
// from the site's.
TEST_F(OverlapParamGather, AcrossSitesTrainsAsWithTheGathersInTheUpdate) {
  expect_overlap_changes_nothing("zero2-sites", {"runtime.ranks=4", "parallel.zero=2", "parallel.dp_sites=2"});
}

// A run stopped after step 3 (its gathers in flight) resumes to the uninterrupted run's state.
TEST_F(OverlapParamGather, AStoppedRunResumesToTheSameState) {
  const std::vector<std::string> layout = {"runtime.ranks=2", "parallel.zero=1", "parallel.overlap_param_gather=true"};
  train("whole", layout);
  std::vector<std::string> stopped = layout;
  stopped.push_back("train.exit_interval=3");
  train("resumed", stopped);
  std::vector<std::string> resumed = layout;
  resumed.push_back("train.resume=true");
  train("resumed", resumed);
  const double difference = testing::checkpoint_difference(root_, "whole", "resumed",
                                                           [](const ckpt::LoadedCheckpoint& c) { return c.names(); });
  EXPECT_EQ(difference, 0.0);
}

// DiLoCo's outer step reads and replaces the parameters after the update: it waits for the gathers.
TEST_F(OverlapParamGather, DilocoOuterStepsReadTheGatheredParameters) {
  expect_overlap_changes_nothing("zero1-diloco", {"runtime.ranks=4", "parallel.zero=1", "parallel.dp_sites=2",
                                                  "parallel.outer=diloco", "parallel.outer_steps=2"});
}

// The metric: seconds a rank blocked on the gathers, reported each step at ZeRO 1-2.
TEST_F(OverlapParamGather, StepsReportTheirWaitForTheGathers) {
  const std::vector<nlohmann::json> records =
      train("metric", {"runtime.ranks=2", "parallel.zero=1", "parallel.overlap_param_gather=true"});
  ASSERT_FALSE(records.empty());
  for (const nlohmann::json& r : records) {
    ASSERT_TRUE(r.contains("param_gather_wait_s")) << r.dump();
    EXPECT_GE(r.at("param_gather_wait_s").get<double>(), 0.0);
  }
}

TEST_F(OverlapParamGather, AtZero0Or3ItIsAnErrorNamingTheKeys) {
  for (int zero : {0, 3}) {
    try {
      train("refused-" + std::to_string(zero),
            {"runtime.ranks=2", "parallel.zero=" + std::to_string(zero), "parallel.overlap_param_gather=true"});
      ADD_FAILURE() << "zero " << zero << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parallel.overlap_param_gather"), std::string::npos) << what;
      EXPECT_NE(what.find("parallel.zero=1 or 2"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace loom::train
