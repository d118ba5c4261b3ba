#include "loom/config/grpo_environments.h"

#include <algorithm>
#include <string>

#include "loom/core/error.h"

namespace loom::config {

std::vector<GrpoEnvironment> run_environments(const GrpoConfig& grpo) {
  std::vector<GrpoEnvironment> out = grpo.environments;
  if (out.empty()) out.emplace_back();  // the one environment of the run's keys
  for (GrpoEnvironment& e : out) {
    if (e.task.empty()) e.task = grpo.environment;
    if (e.servers == 0) e.servers = grpo.environment_servers;
    if (e.name.empty()) e.name = e.task;
    if (e.task_digits == 0) e.task_digits = grpo.task_digits;
    if (e.task_numbers == 0) e.task_numbers = grpo.task_numbers;
    if (e.max_turns == 0) e.max_turns = grpo.max_turns;
    if (e.max_tokens == 0) e.max_tokens = grpo.max_tokens;
  }
  return out;
}

int environment_server_count(const GrpoConfig& grpo) {
  int servers = 0;
  for (const GrpoEnvironment& e : run_environments(grpo)) servers += e.servers;
  return servers;
}

std::string environment_servers_key(const GrpoConfig& grpo) {
  return grpo.environments.empty() ? "grpo.environment_servers" : "grpo.environments[i].servers";
}

int environment_of_server(const GrpoConfig& grpo, int server) {
  const std::vector<GrpoEnvironment> environments = run_environments(grpo);
  int first = 0;
  for (size_t i = 0; i < environments.size(); ++i) {
    first += environments[i].servers;
    if (server >= 0 && server < first) return static_cast<int>(i);
  }
  throw Error("environment server " + std::to_string(server) + " is not one of the run's " + std::to_string(first) +
              " (the servers of grpo.environments, or grpo.environment_servers)");
}

int64_t max_sample_tokens(const GrpoConfig& grpo) {
  int64_t most = 1;
  for (const GrpoEnvironment& e : run_environments(grpo))
    most = std::max(most, static_cast<int64_t>(e.max_turns) * e.max_tokens);
  return most;
}

}  // namespace loom::config
