#pragma once
// Rollout groups as JSON, the form the controller hands a step's batch to the learner in
// (GET /batch, docs/grpo.md). Parsing checks every field and names the one that is wrong.
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/rl/rollout.h"

namespace loom::rl {

nlohmann::json group_to_json(const RolloutGroup& group);
// Throws loom::Error naming the field ("groups[2].samples[0].trained: ...").
RolloutGroup group_from_json(const nlohmann::json& value, const std::string& where = "group");

nlohmann::json groups_to_json(const std::vector<RolloutGroup>& groups);
std::vector<RolloutGroup> groups_from_json(const nlohmann::json& value, const std::string& where = "groups");

}  // namespace loom::rl
