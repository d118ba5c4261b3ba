// Which environment each prompt of a GRPO run goes to: every environment's share of any prefix of
// the run within one prompt of its weight's, its task indices 0, 1, 2, ... in order, the same
// picks whatever prompt a lookup starts from; one environment: prompt n is its task n.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/config/run_config.h"
#include "loom/rl/controller/prompt_mix.h"

namespace loom::rl {
namespace {

config::GrpoConfig environments(const std::vector<double>& weights) {
  config::GrpoConfig g;
  const char* tasks[] = {"arithmetic", "countdown", "calculator"};
  for (size_t i = 0; i < weights.size(); ++i) {
    config::GrpoEnvironment e;
    e.name = "env" + std::to_string(i);
    e.task = tasks[i % 3];
    e.weight = weights[i];
    g.environments.push_back(e);
  }
  return g;
}

TEST(PromptMix, EachEnvironmentGetsItsShareOfEveryPrefixAndItsTasksInOrder) {
  for (const std::vector<double>& weights : std::vector<std::vector<double>>{{3, 1}, {0.5, 0.3, 0.2}, {1, 1, 1}, {7, 0.01}}) {
    const PromptMix mix(environments(weights));
    double total = 0;
    for (double w : weights) total += w;
    std::vector<int64_t> counts(weights.size(), 0);
    for (int64_t n = 0; n < 2000; ++n) {
      const EnvironmentPrompt p = mix.at(n);
      ASSERT_GE(p.environment, 0);
      ASSERT_LT(p.environment, static_cast<int>(weights.size()));
      EXPECT_EQ(p.task_index, counts[static_cast<size_t>(p.environment)]) << "prompt " << n;
      ++counts[static_cast<size_t>(p.environment)];
      for (size_t e = 0; e < weights.size(); ++e) {
        const double share = static_cast<double>(n + 1) * weights[e] / total;
        EXPECT_LE(std::abs(static_cast<double>(counts[e]) - share), 1.0) << "environment " << e << " after " << n + 1;
      }
    }
  }
}

TEST(PromptMix, OneEnvironmentsPromptIsItsTask) {
  config::GrpoConfig one;
  one.environment = "arithmetic";
  const PromptMix mix(one);
  for (int64_t n : {0, 1, 2, 17, 123456789}) {
    EXPECT_EQ(mix.at(n).environment, 0);
    EXPECT_EQ(mix.at(n).task_index, n);
  }
}

TEST(PromptMix, ThreeToOneInterleaves) {
  const PromptMix mix(environments({3, 1}));
  std::string order;
  for (int64_t n = 0; n < 8; ++n) order += static_cast<char>('a' + mix.at(n).environment);
  EXPECT_EQ(order, "aabaaaba");
}

}  // namespace
}  // namespace loom::rl
