#include <gtest/gtest.h>

#include "cli_support.h"

namespace loom::testing {
namespace {

TEST(PlanCli, PrintsTheTimelineAndTheBubble) {
  CommandResult r = run_loom("plan schedule --pp 4 --microbatches 8 --schedule interleaved --virtual 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stage 3 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("F7b"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bubble fraction 0.1875 (theory (p - 1) / (v m) = 0.1875)"), std::string::npos) << r.output;
  r = run_loom("plan schedule --pp 2 --microbatches 3 --list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stage 1: recv_forward(0) forward(0) backward(0) send_backward(0)"), std::string::npos)
      << r.output;
}

TEST(PlanCli, ScheduleThatCannotRunIsAClearError) {
  CommandResult r = run_loom("plan schedule --pp 4 --microbatches 6 --schedule interleaved --virtual 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("multiple of the stages (4)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::testing
