#include "loom/config/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::config {
namespace {

class Metrics : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_metrics_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string run_dir() const { return (dir_ / "run").string(); }
  std::string metrics() const { return read_file(run_dir() + "/metrics.jsonl"); }
  void write_steps(int from, int to, int64_t resume = 0) {
    MetricsWriter writer(run_dir(), resume);
    for (int step = from; step < to; ++step) writer.write({{"step", step}, {"loss", 1.0 / (step + 1)}});
  }
  std::filesystem::path dir_;
};

TEST_F(Metrics, CreatesRunDirAndWritesOneLinePerObject) {
  MetricsWriter writer(run_dir(), 0);
  EXPECT_EQ(writer.path(), run_dir() + "/metrics.jsonl");
  writer.write({{"step", 0}, {"loss", 2.5}});
  // Flushed at once: a reader sees the line while the writer is still open.
  EXPECT_EQ(metrics(), "{\"loss\":2.5,\"step\":0}\n");
  writer.write({{"step", 1}, {"loss", 2.0}, {"val_loss", 2.1}});
  EXPECT_EQ(metrics(), "{\"loss\":2.5,\"step\":0}\n{\"loss\":2.0,\"step\":1,\"val_loss\":2.1}\n");
  EXPECT_THROW(writer.write(nlohmann::json::array({1, 2})), Error);
}

TEST_F(Metrics, FreshRunReplacesAnOldFile) {
  write_steps(0, 5);
  write_steps(0, 2);
  EXPECT_EQ(metrics(), "{\"loss\":1.0,\"step\":0}\n{\"loss\":0.5,\"step\":1}\n");
}

TEST_F(Metrics, ResumeKeepsStepsBeforeTheResumeStepAndAppends) {
  write_steps(0, 8);  // the crashed run got to step 7; its checkpoint is at step 5
  {
    // A torn last line, as a crash mid-write leaves it.
    std::ofstream(run_dir() + "/metrics.jsonl", std::ios::app) << "{\"step\": 8, \"lo";
  }
  write_steps(5, 7, /*resume=*/5);
  std::string text = metrics();
  std::vector<int> steps;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line).at("step"));
  EXPECT_EQ(steps, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
}

TEST_F(Metrics, ResumeWithoutAFileStartsOne) {
  write_steps(3, 4, /*resume=*/3);
  EXPECT_EQ(metrics(), "{\"loss\":0.25,\"step\":3}\n");
}

TEST_F(Metrics, UnwritableRunDirIsNamed) {
  std::filesystem::create_directories(dir_);
  std::ofstream((dir_ / "file").string()) << "x";
  std::string bad = (dir_ / "file" / "run").string();
  try {
    MetricsWriter writer(bad, 0);
    FAIL() << "expected a loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::config
