#include "loom/infer/speculative.h"

#include <unordered_map>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"

namespace loom::infer {

bool accept_draft(const model::TokenDistribution& target, const model::TokenDistribution& draft_distribution,
                  int32_t draft, double u) {
  const double q = draft_distribution.probability(draft);
  if (q <= 0.0) return false;  // never drawn from it; refused rather than divided by zero
  return u * q < target.probability(draft);
}

int32_t residual_token(const model::TokenDistribution& target, const model::TokenDistribution& draft_distribution,
                       double u) {
  std::unordered_map<int32_t, double> draft_probability;
  draft_probability.reserve(draft_distribution.ids.size());
  for (size_t i = 0; i < draft_distribution.ids.size(); ++i) {
    draft_probability[draft_distribution.ids[i]] = draft_distribution.weights[i] / draft_distribution.sum;
  }
  model::TokenDistribution residual;
  for (size_t i = 0; i < target.ids.size(); ++i) {
    const auto found = draft_probability.find(target.ids[i]);
    const double q = found == draft_probability.end() ? 0.0 : found->second;
    const double left = target.weights[i] / target.sum - q;
    if (left <= 0.0) continue;
    residual.ids.push_back(target.ids[i]);
    residual.weights.push_back(left);
    residual.sum += left;
  }
  if (residual.ids.empty()) return model::draw_token(target, u);
  return model::draw_token(residual, u);
}

int parse_speculative_config(const std::string& json) {
  const std::string where = "--speculative-config";
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not JSON (" + e.what() + "); expected {\"method\": \"mtp\", \"num_speculative_tokens\": N}");
  }
  LOOM_CHECK(config.is_object(),
             where + ": expected a JSON object {\"method\": \"mtp\", \"num_speculative_tokens\": N}");
  for (const auto& [key, value] : config.items()) {
    LOOM_CHECK(key == "method" || key == "num_speculative_tokens",
               where + ": unknown key '" + key + "' (this server reads 'method' and 'num_speculative_tokens')");
  }
  LOOM_CHECK(config.contains("method") && config["method"].is_string() && config["method"] == "mtp",
             where + ": 'method' must be \"mtp\" (drafts from the model's multi-token prediction depths), got " +
                 (config.contains("method") ? config["method"].dump() : std::string("nothing")));
  const nlohmann::json& tokens = config.contains("num_speculative_tokens") ? config["num_speculative_tokens"]
                                                                           : nlohmann::json();
  LOOM_CHECK(tokens.is_number_integer() && tokens.get<int64_t>() >= 1 && tokens.get<int64_t>() <= 1024,
             where + ": 'num_speculative_tokens' must be an integer in [1, 1024], got " +
                 (tokens.is_null() ? std::string("nothing") : tokens.dump()));
  return static_cast<int>(tokens.get<int64_t>());
}

}  // namespace loom::infer
