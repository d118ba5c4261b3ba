#include <gtest/gtest.h>

#include "cli_support.h"

namespace loom::testing {
namespace {

TEST(MeshCli, PrintsMegatronOrderedGroups) {
  CommandResult r = run_loom("mesh --world 8 --tp 2 --pp 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp groups (4 of 2): [0 1] [2 3] [4 5] [6 7]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dp groups (4 of 2): [0 2] [1 3] [4 6] [5 7]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pp groups (4 of 2): [0 4] [1 5] [2 6] [3 7]"), std::string::npos) << r.output;
}

TEST(MeshCli, IndivisibleWorldIsAClearError) {
  CommandResult r = run_loom("mesh --world 6 --tp 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("6"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tp"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::testing
