// `loom serve`'s profile windows (ops/window_trace.h): only the ranges that open and close inside
// a window are written, each window to its own file, started and stopped from another thread
// than the one whose ranges they hold; starting twice or stopping none is an error.
#include "loom/ops/window_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::ops {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> names_in(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::vector<std::string> names;
  for (const nlohmann::json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") names.push_back(e.at("name"));
  return names;
}

TEST(WindowTrace, KeepsTheRangesInsideEachWindowStartedAndStoppedFromAnotherThread) {
  const std::string dir = (fs::temp_directory_path() / ("loom-window-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  WindowTrace window(dir, "serve");
  trace::set_thread_sink(&window);
  auto other_thread = [](auto&& body) { std::thread(body).join(); };
  {
    trace::Range across("open across the start");
    trace::Range before("closed before it");
    before.end();
    other_thread([&] { window.start(); });
    EXPECT_TRUE(window.started());
    { trace::Range step("engine step"); trace::Range forward("engine forward"); }
    { trace::Range step("engine step"); }
    trace::Range across_stop("open across the stop");
    WindowTrace::Written written;
    other_thread([&] { written = window.stop(); });
    EXPECT_EQ(written.path, dir + "/serve-1.json");
    EXPECT_EQ(written.ranges, 3);
  }
  EXPECT_EQ(names_in(dir + "/serve-1.json"),
            (std::vector<std::string>{"engine step", "engine forward", "engine step"}));
  window.start();
  { trace::Range step("second window"); }
  EXPECT_EQ(window.stop().path, dir + "/serve-2.json");
  EXPECT_EQ(names_in(dir + "/serve-2.json"), std::vector<std::string>{"second window"});
  trace::set_thread_sink(nullptr);
  fs::remove_all(dir);
}

TEST(WindowTrace, StartingTwiceOrStoppingNoneIsAnError) {
  WindowTrace window(fs::temp_directory_path().string(), "unused");
  EXPECT_THROW(window.stop(), Error);
  window.start();
  EXPECT_THROW(window.start(), Error);
}

}  // namespace
}  // namespace loom::ops
