// Resuming compares the checkpoint's stored config with today's: a key added after the
// checkpoint was written counts as its default, a real change is named with both values.
#include <gtest/gtest.h>

#include <string>

#include "loom/train/config_changes.h"

namespace loom::train {
namespace {

// A config as an older loom wrote it: one model key (model.moe_shared_expert_gate) removed.
std::string without_line(std::string yaml, const std::string& key) {
  const size_t at = yaml.find(key + ":");
  EXPECT_NE(at, std::string::npos) << key << " not in the stored config";
  const size_t start = yaml.rfind('\n', at) + 1, end = yaml.find('\n', at);
  return yaml.erase(start, end - start + 1);
}

TEST(ConfigChanges, AKeyMissingFromAnOlderCheckpointCountsAsItsDefault) {
  config::RunConfig now;
  const std::string stored = without_line(config::to_yaml(now), "moe_shared_expert_gate");
  ASSERT_EQ(stored.find("moe_shared_expert_gate"), std::string::npos);
  const ConfigChanges changes = compare_configs(stored, now);
  EXPECT_TRUE(changes.model.empty()) << describe_changes(changes.model);
  EXPECT_TRUE(changes.settings.empty()) << describe_changes(changes.settings);
}

TEST(ConfigChanges, AChangedModelKeyIsNamedWithBothValues) {
  config::RunConfig before;
  config::RunConfig now = before;
  now.model.moe.shared_expert_gate = !before.model.moe.shared_expert_gate;
  now.optim.lr = before.optim.lr * 2;
  const ConfigChanges changes = compare_configs(config::to_yaml(before), now);
  ASSERT_EQ(changes.model.size(), 1u) << describe_changes(changes.model);
  EXPECT_EQ(changes.model[0].key, "model.moe_shared_expert_gate");
  ASSERT_EQ(changes.settings.size(), 1u) << describe_changes(changes.settings);
  EXPECT_EQ(changes.settings[0].key, "optim.lr");
}

}  // namespace
}  // namespace loom::train
