// The profiled steps' trace (ops/step_trace.h): only their ranges are kept, nested as opened, the
// device waited for at every range's ends and its profiler bracketing the steps, the file a
// Chrome trace written whole, and the summary by phase.
#include "loom/ops/step_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::ops {
namespace {

namespace fs = std::filesystem;

struct TraceFile {
  nlohmann::json json;
  std::vector<nlohmann::json> slices;  // the "X" events
  const nlohmann::json* find(const std::string& name) const {
    for (const nlohmann::json& e : slices)
      if (e.at("name") == name) return &e;
    return nullptr;
  }
};

TraceFile read_trace(const std::string& path) {
  std::ifstream in(path);
  TraceFile file;
  file.json = nlohmann::json::parse(in);
  for (const nlohmann::json& e : file.json.at("traceEvents"))
    if (e.at("ph") == "X") file.slices.push_back(e);
  return file;
}

bool inside(const nlohmann::json& inner, const nlohmann::json& outer) {
  const double a = inner.at("ts"), b = a + inner.at("dur").get<double>();
  const double c = outer.at("ts"), d = c + outer.at("dur").get<double>();
  return a >= c && b <= d;
}

class StepTraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("loom-step-trace-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Steps 1..4 with two phases each, the second holding a block.
  std::string run_steps(StepTrace& trace) {
    std::string summary;
    for (int64_t step = 1; step <= 4; ++step) {
      trace.begin_step(step);
      {
        trace::Range range("step", step);
        { trace::Range phase("forward_backward"); trace::Range block("block", 0, "forward"); }
        { trace::Range phase("optimizer"); }
      }
      summary += trace.end_step(step);
    }
    return summary;
  }
  // Steps first..last of rank 0, traced to dir_/rank-0.json.
  StepTraceSettings steps(int64_t first, int64_t last) const {
    StepTraceSettings settings;
    settings.first_step = first;
    settings.last_step = last;
    settings.path = dir_ + "/rank-0.json";
    return settings;
  }
  std::string dir_;
};

TEST_F(StepTraceTest, KeepsTheProfiledStepsRangesNestedAndWritesThemAsAChromeTrace) {
  std::vector<std::string> device;
  StepTraceSettings settings;
  settings.first_step = 2;
  settings.last_step = 3;
  settings.rank = 5;
  settings.path = dir_ + "/profile/rank-5.json";  // the directory is made
  settings.synchronize = [&] { device.push_back("sync"); };
  settings.device_profiler = [&](bool start) { device.push_back(start ? "start" : "stop"); };
  std::string summary;
  {
    StepTrace trace(settings);
    summary = run_steps(trace);
  }
  const TraceFile file = read_trace(settings.path);
  std::vector<std::string> names;
  for (const nlohmann::json& e : file.slices) names.push_back(e.at("name"));
  EXPECT_EQ(names, (std::vector<std::string>{"step 2", "forward_backward", "block 0 forward", "optimizer", "step 3",
                                             "forward_backward", "block 0 forward", "optimizer"}));
  for (const nlohmann::json& e : file.slices) {
    EXPECT_EQ(e.at("pid"), 5);
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
  }
  EXPECT_TRUE(inside(file.slices[2], file.slices[1]));
  EXPECT_TRUE(inside(file.slices[1], file.slices[0]));
  EXPECT_TRUE(inside(file.slices[3], file.slices[0]));
  EXPECT_FALSE(inside(file.slices[4], file.slices[0]));
  EXPECT_EQ(file.json.at("otherData").at("first_step"), 2);
  EXPECT_EQ(file.json.at("otherData").at("synchronized"), true);
  // The profiler starts after the earlier steps' work and stops after the last step's; the device
  // is waited for at both ends of each of the 8 ranges.
  ASSERT_GE(device.size(), 4u);
  EXPECT_EQ(device.front(), "sync");
  EXPECT_EQ(device[1], "start");
  EXPECT_EQ(device.back(), "stop");
  EXPECT_EQ(std::count(device.begin(), device.end(), "sync"), 1 + 2 * 8 + 1);
  // The summary: the phases inside a step, each once, after the step's mean.
  EXPECT_NE(summary.find("profile: rank 5, steps 2-3 (device synchronized)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("forward_backward"), std::string::npos) << summary;
  EXPECT_NE(summary.find("optimizer"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("block 0 forward"), std::string::npos) << summary;
  EXPECT_NE(summary.find(settings.path), std::string::npos) << summary;
}

TEST_F(StepTraceTest, OneStepOnTheHostNeedsNoDeviceAndTheSinkIsTheThreadsOnlyWhileItRecords) {
  StepTraceSettings settings = steps(4, 4);
  {
    StepTrace trace(settings);
    EXPECT_EQ(trace::set_thread_sink(nullptr), nullptr);  // not before the profiled step
    const std::string summary = run_steps(trace);
    EXPECT_NE(summary.find("profile: rank 0, steps 4-4: "), std::string::npos) << summary;
  }
  const TraceFile file = read_trace(settings.path);
  ASSERT_EQ(file.slices.size(), 4u);
  EXPECT_EQ(file.slices[0].at("name"), "step 4");
  EXPECT_EQ(file.json.at("otherData").at("synchronized"), false);
  // Gone once written: a later range reaches no sink.
  EXPECT_EQ(trace::set_thread_sink(nullptr), nullptr);
}

TEST_F(StepTraceTest, ARunEndingInsideItsProfiledStepsWritesThoseItTracedOnce) {
  int starts = 0, stops = 0;
  StepTraceSettings settings = steps(2, 9);  // past the run's 4 steps
  settings.device_profiler = [&](bool start) { ++(start ? starts : stops); };
  StepTrace trace(settings);
  EXPECT_EQ(run_steps(trace), "");
  const std::string summary = trace.end_run();
  EXPECT_NE(summary.find("profile: rank 0, steps 2-4: "), std::string::npos) << summary;
  EXPECT_EQ(trace.end_run(), "");  // written once
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(stops, 1);
  const TraceFile file = read_trace(settings.path);
  EXPECT_EQ(file.slices.size(), 3u * 4u);
  EXPECT_EQ(file.json.at("otherData").at("last_step"), 4);
}

TEST_F(StepTraceTest, ARunEndingBeforeItsProfiledStepsWritesNothing) {
  StepTraceSettings settings = steps(7, 9);
  StepTrace trace(settings);
  run_steps(trace);
  EXPECT_EQ(trace.end_run(), "");
  EXPECT_FALSE(fs::exists(settings.path));
}

TEST_F(StepTraceTest, TheSummaryCountsOnlyTheStepsPhasesNotAnEvaluationBetweenSteps) {
  StepTraceSettings settings = steps(1, 2);
  StepTrace trace(settings);
  trace.begin_step(1);
  { trace::Range step("step", 1); trace::Range phase("optimizer"); }
  trace.end_step(1);
  { trace::Range evaluate("evaluate"); trace::Range inside("head forward"); }  // between the steps
  trace.begin_step(2);
  { trace::Range step("step", 2); trace::Range phase("optimizer"); }
  const std::string summary = trace.end_step(2);
  EXPECT_NE(summary.find("optimizer"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("head forward"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("evaluate"), std::string::npos) << summary;
  // The trace itself keeps the evaluation.
  EXPECT_NE(read_trace(settings.path).find("head forward"), nullptr);
}

TEST_F(StepTraceTest, ARunResumedInsideItsProfiledStepsNamesTheStepsItTraced) {
  StepTraceSettings settings = steps(2, 4);
  StepTrace trace(settings);
  std::string summary;
  for (int64_t step = 3; step <= 4; ++step) {  // resumed after step 2
    trace.begin_step(step);
    { trace::Range range("step", step); }
    summary += trace.end_step(step);
  }
  EXPECT_NE(summary.find("profile: rank 0, steps 3-4: "), std::string::npos) << summary;
  EXPECT_EQ(read_trace(settings.path).json.at("otherData").at("first_step"), 3);
}

TEST_F(StepTraceTest, ADeviceThatFailsWhileARangeEndsIsLeftToTheRunToReport) {
  int waits = 0;
  StepTraceSettings settings = steps(1, 1);
  settings.synchronize = [&] {
    if (++waits == 3) throw Error("the device failed");
  };
  StepTrace trace(settings);
  trace.begin_step(1);  // wait 1
  {
    trace::Range step("step", 1);   // wait 2
    trace::Range inner("block 0");  // wait 3 throws: no exception leaves the range
  }
  EXPECT_EQ(waits, 3);  // and the device is not waited for again
  EXPECT_NE(trace.end_step(1).find("steps 1-1"), std::string::npos);
}

TEST_F(StepTraceTest, StepsOutsideTheRangeAsked) {
  StepTraceSettings settings;
  settings.first_step = 3;
  settings.last_step = 2;
  EXPECT_THROW(StepTrace trace(settings), Error);
  settings.first_step = 0;
  EXPECT_THROW(StepTrace trace(settings), Error);
}

TEST_F(StepTraceTest, AnUnwritableTraceNamesItsPath) {
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/file") << "not a directory";
  StepTraceSettings settings;
  settings.path = dir_ + "/file/rank-0.json";
  StepTrace trace(settings);
  trace.begin_step(1);
  { trace::Range range("step", 1); }
  try {
    trace.end_step(1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::ops
