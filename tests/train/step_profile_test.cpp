// Profiling a run (profile.*; docs/operations.md "Profiling a run"): each traced rank's Chrome
// trace holds its profiled steps' ranges and no other step's, nested as the work is (a block's
// forward inside its micro-batch's forward); pipeline stages trace their micro-batches and
// chunks; a device rank brackets the steps with its profiler; tracing changes no number. And
// the memory every step's metrics report.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_training.h"
#include "loom/train/step_profile.h"

namespace loom::train {
namespace {

struct Slice {
  std::string name;
  double begin = 0, end = 0;
  bool contains(const Slice& s) const { return s.begin >= begin && s.end <= end; }
};

std::vector<Slice> slices_of(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  if (!in.good()) return {};
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::vector<Slice> slices;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const double ts = e.at("ts");
    slices.push_back({e.at("name"), ts, ts + e.at("dur").get<double>()});
  }
  return slices;
}

int count_named(const std::vector<Slice>& slices, const std::string& name) {
  int n = 0;
  for (const Slice& s : slices) n += s.name == name;
  return n;
}

// The innermost slice named `outer` holding the first slice named `inner` (empty name: none).
std::string enclosing(const std::vector<Slice>& slices, const std::string& inner, const std::string& outer) {
  for (const Slice& s : slices) {
    if (s.name != inner) continue;
    for (const Slice& o : slices)
      if (o.name == outer && o.contains(s)) return o.name;
    return "";
  }
  return "";
}

// Every two slices are nested or apart: never overlapping.
void expect_well_nested(const std::vector<Slice>& slices) {
  for (const Slice& a : slices) {
    for (const Slice& b : slices) {
      const bool apart = a.end <= b.begin || b.end <= a.begin;
      EXPECT_TRUE(apart || a.contains(b) || b.contains(a)) << a.name << " and " << b.name << " overlap";
    }
  }
}

class StepProfile : public DeviceTraining {};

TEST_F(StepProfile, EachRankTracesItsProfiledStepsOnlyAndTheNumbersStayTheSame) {
  // dp 2, each rank 2 micro-batches of 1 per step.
  const std::vector<double> plain = train("profile-plain", kLlama, {"runtime.ranks=2", "train.micro_batch=1"});
  std::string console;
  const std::vector<double> traced = train(
      "profile-dp", kLlama,
      {"runtime.ranks=2", "train.micro_batch=1", "profile.first_step=2", "profile.last_step=3", "profile.ranks=[]"}, 4,
      &console);
  EXPECT_EQ(traced, plain);
  EXPECT_NE(console.find("profile: rank 0, steps 2-3: "), std::string::npos) << console;
  EXPECT_NE(console.find("forward_backward"), std::string::npos) << console;
  for (const int rank : {0, 1}) {
    const std::vector<Slice> slices = slices_of(root_ + "/profile-dp/profile/rank-" + std::to_string(rank) + ".json");
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(count_named(slices, "step 1"), 0);
    EXPECT_EQ(count_named(slices, "step 2"), 1);
    EXPECT_EQ(count_named(slices, "step 3"), 1);
    EXPECT_EQ(count_named(slices, "step 4"), 0);
    // 2 steps of 2 micro-batches of 2 blocks.
    EXPECT_EQ(count_named(slices, "micro-batch 1"), 2);
    EXPECT_EQ(count_named(slices, "block 1 forward"), 4);
    EXPECT_EQ(count_named(slices, "block 0 backward"), 4);
    for (const char* name : {"embedding forward", "head forward", "head backward", "embedding backward"})
      EXPECT_EQ(count_named(slices, name), 4) << name;  // per micro-batch
    for (const char* name : {"batch", "loss agreement", "optimizer", "gradient reduction", "gradient norm", "update"})
      EXPECT_EQ(count_named(slices, name), 2) << name;  // per step
    EXPECT_EQ(enclosing(slices, "block 0 forward", "forward"), "forward");
    EXPECT_EQ(enclosing(slices, "forward", "micro-batch 0"), "micro-batch 0");
    EXPECT_EQ(enclosing(slices, "micro-batch 0", "forward_backward"), "forward_backward");
    EXPECT_EQ(enclosing(slices, "update", "optimizer"), "optimizer");
    EXPECT_EQ(enclosing(slices, "optimizer", "step 2"), "step 2");
    expect_well_nested(slices);
  }
}

TEST_F(StepProfile, PipelineStagesTraceTheirMicroBatchesAndADeviceBracketsTheStepsWithItsProfiler) {
  ::loom::testing::reset_emulated_census();
  train("profile-pp", kLlama,
        {"runtime.ranks=2", "parallel.pp=2", "runtime.device=cuda", "profile.first_step=3", "profile.ranks=[1]"});
  EXPECT_FALSE(fs::exists(root_ + "/profile-pp/profile/rank-0.json"));
  const std::vector<Slice> slices = slices_of(root_ + "/profile-pp/profile/rank-1.json");
  EXPECT_EQ(count_named(slices, "step 3"), 1);
  EXPECT_EQ(count_named(slices, "step 2"), 0);
  // The last stage holds block 1 and the head, each micro-batch's forward and backward.
  EXPECT_EQ(count_named(slices, "forward micro-batch 0 chunk 0"), 1);
  EXPECT_EQ(count_named(slices, "backward micro-batch 1 chunk 0"), 1);
  EXPECT_EQ(count_named(slices, "block 1 forward"), 2);
  EXPECT_EQ(count_named(slices, "block 0 forward"), 0);
  EXPECT_EQ(enclosing(slices, "head forward", "forward micro-batch 0 chunk 0"), "forward micro-batch 0 chunk 0");
  expect_well_nested(slices);
  // Only the traced rank starts and stops the device's profiler, once.
  const auto& entries = ::loom::testing::emulated_census().entries;
  EXPECT_EQ(entries.count("profiler_capture: start") ? entries.at("profiler_capture: start") : 0, 1);
  EXPECT_EQ(entries.count("profiler_capture: stop") ? entries.at("profiler_capture: stop") : 0, 1);
}

// metrics.jsonl's memory_allocated_bytes and memory_peak_bytes: rank 0's device allocator at the
// step's end and at most during it, at least the fp32 parameters, gradients and two moments it
// holds (16 bytes per parameter) on the device.
TEST_F(StepProfile, EveryStepReportsTheMemoryItsDeviceHoldsAndItsPeak) {
  for (const char* device : {"cpu", "cuda"}) {
    std::string console;
    const std::vector<nlohmann::json> records =
        train_records(std::string("memory-") + device, kLlama, {std::string("runtime.device=") + device}, 2, &console);
    ASSERT_EQ(records.size(), 2u) << device;
    const size_t at = console.find("model: ");
    ASSERT_NE(at, std::string::npos) << console;
    const int64_t parameters = std::stoll(console.substr(at + 7));
    for (const nlohmann::json& r : records) {
      const int64_t allocated = r.at("memory_allocated_bytes"), peak = r.at("memory_peak_bytes");
      EXPECT_GE(allocated, 16 * parameters) << device;
      EXPECT_GE(peak, allocated) << device;
    }
  }
}

// What rank 0 says at start about profile.*.
TEST(DescribeProfile, NamesTheStepsRanksAndFilesOrWhyNoStepIsTraced) {
  config::RunConfig run;
  run.run.dir = "runs/x";
  run.train.steps = 10;
  EXPECT_EQ(describe_profile(run, 0, run.train.steps), "");
  run.profile.first_step = 3;
  run.profile.last_step = 4;
  EXPECT_EQ(describe_profile(run, 0, run.train.steps),
            "profile: steps 3-4 of rank 0 traced to runs/x/profile/rank-<r>.json (a summary printed here when rank 0 "
            "is one)\n");
  run.profile.ranks = {};
  EXPECT_NE(describe_profile(run, 2, run.train.steps).find("steps 3-4 of every rank traced"), std::string::npos);
  run.profile.ranks = {1, 3};
  EXPECT_NE(describe_profile(run, 3, run.train.steps).find("steps 3-4 of ranks 1, 3 traced"), std::string::npos);
  EXPECT_EQ(describe_profile(run, 4, run.train.steps),
            "profile: steps 3-4 done before this run resumed at step 4: no step is traced\n");
  run.profile.first_step = 12;
  run.profile.last_step = 0;
  EXPECT_EQ(describe_profile(run, 0, run.train.steps), "profile: step 12 past train.steps = 10: no step is traced\n");
}

TEST_F(StepProfile, ARankTheRunDoesNotHaveIsAnErrorNamingTheKey) {
  try {
    train("profile-bad-rank", kLlama, {"runtime.ranks=2", "profile.first_step=1", "profile.ranks=[0, 2]"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("profile.ranks names rank 2, but the run has 2 rank(s)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::train
