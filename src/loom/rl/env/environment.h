#pragma once
// A GRPO environment, in NeMo Gym's shape: a set of prompts (task i deterministic in
// (seed, i)), a verifier turning an episode's final answer into a reward (with named
// components), and optional tools the model may call during a multi-turn episode. Served over
// HTTP by EnvironmentServer (env_server.h); shipped: arithmetic, countdown, calculator.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::rl {

struct EnvironmentOptions {
  std::string task = "arithmetic";  // arithmetic | countdown | calculator
  uint64_t seed = 1234;             // task i depends only on (seed, i)
  int digits = 2;                   // arithmetic, calculator: operands of up to `digits` digits
  int numbers = 4;                  // countdown: how many numbers are given
};

struct Episode {
  nlohmann::json messages;  // the prompt: [system?, user]
  nlohmann::json task;      // what verify needs ({"kind", ...})
};

struct Reward {
  double reward = 0.0;
  nlohmann::json components = nlohmann::json::object();  // e.g. {"correct": 1, "well_formed": 1}
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual std::string name() const = 0;
  virtual Episode episode(int64_t index) const = 0;
  // `answer`: the final assistant message's text; `messages`: the whole episode.
  virtual Reward verify(const nlohmann::json& task, const std::string& answer, const nlohmann::json& messages) const = 0;
  // The tools offered, as OpenAI function descriptions (empty: a single-turn task).
  virtual nlohmann::json tools() const { return nlohmann::json::array(); }
  // Runs tool `name` on `arguments`; throws serve::ApiError (400) naming a bad argument.
  virtual nlohmann::json call_tool(const std::string& name, const nlohmann::json& arguments) const;
};

// One of environment_kinds(); an unknown task is an Error listing them.
std::unique_ptr<Environment> make_environment(const EnvironmentOptions& options);
std::vector<std::string> environment_kinds();

}  // namespace loom::rl
