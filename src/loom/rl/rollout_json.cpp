#include "loom/rl/rollout_json.h"

#include "loom/core/error.h"

namespace loom::rl {

namespace {
using nlohmann::json;

template <class T>
std::vector<T> numbers(const json& object, const std::string& key, const std::string& where) {
  LOOM_CHECK(object.contains(key) && object[key].is_array(), where + "." + key + ": must be an array of numbers");
  std::vector<T> out;
  out.reserve(object[key].size());
  for (const json& v : object[key]) {
    LOOM_CHECK(v.is_number(), where + "." + key + ": must be an array of numbers");
    out.push_back(v.get<T>());
  }
  return out;
}

Rollout rollout_from_json(const json& value, const std::string& where) {
  LOOM_CHECK(value.is_object(), where + ": must be an object");
  Rollout r;
  r.tokens = numbers<int32_t>(value, "tokens", where);
  r.trained = numbers<uint8_t>(value, "trained", where);
  r.generation_logprobs = numbers<float>(value, "generation_logprobs", where);
  LOOM_CHECK(r.trained.size() == r.tokens.size() && r.generation_logprobs.size() == r.tokens.size(),
             where + ": tokens, trained and generation_logprobs must have the same length (" + std::to_string(r.tokens.size()) +
                 ", " + std::to_string(r.trained.size()) + ", " + std::to_string(r.generation_logprobs.size()) + ")");
  LOOM_CHECK(value.contains("reward") && value["reward"].is_number(), where + ".reward: must be a number");
  r.reward = value["reward"].get<double>();
  r.truncated = value.value("truncated", false);
  r.environment = value.value("environment", "");
  return r;
}
}  // namespace

json group_to_json(const RolloutGroup& group) {
  json samples = json::array();
  for (const Rollout& r : group.samples) {
    samples.push_back({{"tokens", r.tokens}, {"trained", r.trained}, {"generation_logprobs", r.generation_logprobs},
                       {"reward", r.reward}, {"truncated", r.truncated}, {"environment", r.environment}});
  }
  return {{"prompt_index", group.prompt_index}, {"weight_version", group.weight_version}, {"samples", samples}};
}

RolloutGroup group_from_json(const json& value, const std::string& where) {
  LOOM_CHECK(value.is_object(), where + ": must be an object");
  RolloutGroup g;
  LOOM_CHECK(value.contains("prompt_index") && value["prompt_index"].is_number_integer(), where + ".prompt_index: must be an integer");
  LOOM_CHECK(value.contains("weight_version") && value["weight_version"].is_number_integer(), where + ".weight_version: must be an integer");
  LOOM_CHECK(value.contains("samples") && value["samples"].is_array(), where + ".samples: must be an array");
  g.prompt_index = value["prompt_index"].get<int64_t>();
  g.weight_version = value["weight_version"].get<int64_t>();
  for (size_t i = 0; i < value["samples"].size(); ++i)
    g.samples.push_back(rollout_from_json(value["samples"][i], where + ".samples[" + std::to_string(i) + "]"));
  return g;
}

json groups_to_json(const std::vector<RolloutGroup>& groups) {
  json out = json::array();
  for (const RolloutGroup& g : groups) out.push_back(group_to_json(g));
  return out;
}

std::vector<RolloutGroup> groups_from_json(const json& value, const std::string& where) {
  LOOM_CHECK(value.is_array(), where + ": must be an array of groups");
  std::vector<RolloutGroup> out;
  for (size_t i = 0; i < value.size(); ++i) out.push_back(group_from_json(value[i], where + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace loom::rl
