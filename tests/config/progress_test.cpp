#include "loom/config/progress.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include <sstream>

#include "loom/core/error.h"

namespace loom::config {
namespace {

// A clock the test moves by hand.
struct FakeClock {
  double now = 100.0;
  ProgressBar::Clock fn() {
    return [this] { return now; };
  }
};

TEST(Progress, FormatsParts) {
  EXPECT_EQ(ProgressBar::format_duration(0), "0s");
  EXPECT_EQ(ProgressBar::format_duration(45.4), "45s");
  EXPECT_EQ(ProgressBar::format_duration(62), "1m02s");
  EXPECT_EQ(ProgressBar::format_duration(7380), "2h03m");
  EXPECT_EQ(ProgressBar::format_duration(-1), "--");
  EXPECT_EQ(ProgressBar::format_bar(0, 10, 10), "[..........]");
  EXPECT_EQ(ProgressBar::format_bar(5, 10, 10), "[#####.....]");
  EXPECT_EQ(ProgressBar::format_bar(10, 10, 10), "[##########]");
  EXPECT_EQ(ProgressBar::format_stats(12, 100, 3.21042, 3e-4, 0.9123, 12345, 62),
            "12/100 loss 3.2104 lr 3.00e-04 gnorm 0.912 12.3k tok/s ETA 1m02s");
  EXPECT_EQ(ProgressBar::format_stats(1, 2, 1, 1, 1, 950, -1), "1/2 loss 1.0000 lr 1.00e+00 gnorm 1.000 950 tok/s ETA --");
  EXPECT_NE(ProgressBar::format_stats(1, 2, 1, 1, 1, 4.2e6, 0).find("4.2M tok/s"), std::string::npos);
}

TEST(Progress, PlainLinesEveryIntervalAndAtTheLastStep) {
  std::ostringstream out;
  FakeClock clock;
  {
    ProgressBar bar(10, 0, /*is_terminal=*/false, /*log_interval=*/4, out, clock.fn());
    for (int step = 1; step <= 10; ++step) {
      clock.now += 2.0;  // two seconds a step
      bar.update(step, 2.5, 1e-3, 0.5, 2000);
      if (step == 5) bar.message("validation loss 2.4000");
    }
  }
  EXPECT_EQ(out.str(),
            "step 4/10 loss 2.5000 lr 1.00e-03 gnorm 0.500 2.0k tok/s ETA 12s\n"
            "validation loss 2.4000\n"
            "step 8/10 loss 2.5000 lr 1.00e-03 gnorm 0.500 2.0k tok/s ETA 4s\n"
            "step 10/10 loss 2.5000 lr 1.00e-03 gnorm 0.500 2.0k tok/s ETA 0s\n");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(Progress, EtaCountsOnlyStepsTimedSinceResume) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(100, 60, false, 1, out, clock.fn());
  clock.now += 10.0;  // step 61 took 10 s
  bar.update(61, 1.0, 1e-4, 1.0, 100);
  EXPECT_NE(out.str().find("61/100"), std::string::npos);
  EXPECT_NE(out.str().find("ETA 6m30s"), std::string::npos) << out.str();  // 39 steps x 10 s
}

TEST(Progress, EtaWeighsStepsByTheirWork) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(10, 2, false, 1, out, clock.fn());
  // Steps 1-4 of 1 unit each, the rest of 3 (a batch ramp-up): 4 + 6 x 3 = 22 units in all.
  bar.set_work([](int step) { return step <= 4 ? step : 4.0 + 3.0 * (step - 4); });
  clock.now += 8.0;  // steps 3 and 4 (2 units) took 8 s: 4 s a unit
  bar.update(4, 1.0, 1e-4, 1.0, 100);
  EXPECT_NE(out.str().find("ETA 1m12s"), std::string::npos) << out.str();  // 18 units left
  clock.now += 12.0;  // step 5 (3 units)
  bar.update(5, 1.0, 1e-4, 1.0, 100);
  EXPECT_NE(out.str().find("ETA 1m00s"), std::string::npos) << out.str();  // 5 units in 20 s, 15 left
}

TEST(Progress, TerminalRedrawsInPlaceAndKeepsBarUnderMessages) {
  std::ostringstream out;
  FakeClock clock;
  {
    ProgressBar bar(2, 0, /*is_terminal=*/true, 1, out, clock.fn());
    clock.now += 1.0;
    bar.update(1, 1.0, 1e-3, 1.0, 10);
    bar.message("val");
    clock.now += 1.0;
    bar.update(2, 1.0, 1e-3, 1.0, 10);
  }
  const std::string line1 = "[##########..........] 1/2 loss 1.0000 lr 1.00e-03 gnorm 1.000 10 tok/s ETA 1s";
  const std::string line2 = "[####################] 2/2 loss 1.0000 lr 1.00e-03 gnorm 1.000 10 tok/s ETA 0s";
  // The message blanks the bar, takes its own line, and the bar is drawn again below it.
  std::string expected = "\r" + line1 + "\rval" + std::string(line1.size() - 3, ' ') + "\n" + "\r" + line1 +
                         "\r" + line2 + "\n";
  EXPECT_EQ(out.str(), expected);
}

TEST(Progress, RejectsBadArguments) {
  std::ostringstream out;
  EXPECT_THROW(ProgressBar(0, 0, false, 1, out), Error);
  EXPECT_THROW(ProgressBar(10, 11, false, 1, out), Error);
  EXPECT_THROW(ProgressBar(10, 0, false, 0, out), Error);
}

}  // namespace
}  // namespace loom::config

namespace loom::config {
namespace {

// Under mpirun or srun ranks may get a pseudo-terminal while the job's log is a file: no '\r' then.
TEST(ProgressBarTest, LauncherRanksAreNotInteractive) {
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_FALSE(stdout_is_interactive());
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
}

}  // namespace
}  // namespace loom::config
