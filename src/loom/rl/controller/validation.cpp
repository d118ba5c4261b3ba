#include "loom/rl/controller/validation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <ostream>
#include <thread>

#include "loom/config/grpo_environments.h"
#include "loom/rl/agent_loop.h"
#include "loom/rl/controller/episode_options.h"

namespace loom::rl {

void ValidationRewards::add_prompt(const std::vector<Rollout>& answered) {
  if (answered.empty()) {
    ++failed_prompts;
    return;
  }
  ++prompts;
  for (const Rollout& s : answered) {
    sum_ += s.reward;
    sum_squares_ += s.reward * s.reward;
    truncated += s.truncated;
    ++samples;
  }
}

void ValidationRewards::add(const ValidationRewards& other) {
  prompts += other.prompts;
  samples += other.samples;
  truncated += other.truncated;
  failed_prompts += other.failed_prompts;
  sum_ += other.sum_;
  sum_squares_ += other.sum_squares_;
}

void ValidationRewards::finish() {
  if (samples == 0) return;
  const double n = static_cast<double>(samples);
  reward_mean = sum_ / n;
  const double variance = std::max(0.0, sum_squares_ / n - reward_mean * reward_mean);
  reward_stderr = samples > 1 ? std::sqrt(variance / (n - 1)) : 0.0;
}

nlohmann::json ValidationRewards::to_json() const {
  return {{"reward_mean", reward_mean}, {"reward_stderr", reward_stderr}, {"prompts", prompts},
          {"samples", samples},         {"truncated", truncated},         {"failed_prompts", failed_prompts}};
}

nlohmann::json ValidationResult::to_json() const {
  nlohmann::json out = all.to_json();
  out["weight_version"] = weight_version;
  out["seconds"] = seconds;
  nlohmann::json per_environment = nlohmann::json::object();
  for (const auto& [name, rewards] : environments) per_environment[name] = rewards.to_json();
  out["environments"] = per_environment;
  return out;
}

namespace {

// One held-out prompt's samples, or none when every attempt failed.
std::vector<Rollout> answer(const config::RunConfig& config, Roles& roles, const EnvironmentPrompt& prompt,
                            size_t turn) {
  const config::GrpoConfig& g = config.grpo;
  for (int attempt = 0; attempt <= g.episode_retries; ++attempt) {
    // The same seed for a prompt at every validation (attempt 0's): versions differ in their weights only.
    AgentOptions o = episode_options(config, roles, turn + static_cast<size_t>(attempt), prompt, 0);
    o.samples = g.validation_samples;
    o.temperature = g.validation_temperature;
    o.top_p = g.validation_temperature > 0 ? g.top_p : 1.0;
    try {
      return run_group(o, prompt.task_index).samples;
    } catch (const EpisodeFailure& e) {
      roles.report_failure(e.role, e.role == FailedRole::Environment ? o.environment_url : o.model_url);
    }
  }
  return {};
}

}  // namespace

ValidationResult validate(const config::RunConfig& config, Roles& roles, int64_t weight_version, std::ostream& log) {
  const config::GrpoConfig& g = config.grpo;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<config::GrpoEnvironment> environments = config::run_environments(g);
  const int64_t per_environment = g.validation_prompts;
  const int64_t total = per_environment * static_cast<int64_t>(environments.size());
  std::vector<ValidationRewards> rewards(environments.size());
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  std::exception_ptr error;  // the first error that is not an episode's (the run's), rethrown here
  std::vector<std::thread> threads;
  for (int t = 0; t < g.rollout_thread_count(); ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int64_t i = next++; i < total; i = next++) {
          // Environment by environment: each one's prompts in order.
          const EnvironmentPrompt prompt{static_cast<int>(i / per_environment),
                                         g.validation_first_index + i % per_environment};
          const std::vector<Rollout> samples = answer(config, roles, prompt, static_cast<size_t>(t));
          std::lock_guard<std::mutex> lock(mutex);
          rewards[static_cast<size_t>(prompt.environment)].add_prompt(samples);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        next = total;  // the other threads stop after their prompt
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  ValidationResult result;
  result.weight_version = weight_version;
  for (size_t e = 0; e < environments.size(); ++e) {
    result.all.add(rewards[e]);
    rewards[e].finish();
    result.environments.emplace_back(environments[e].name, rewards[e]);
  }
  result.all.finish();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log << "loom grpo: validation of step-" << weight_version << ": reward " << result.all.reward_mean << " +- "
      << result.all.reward_stderr << " over " << result.all.samples << " samples of " << result.all.prompts
      << " held-out prompts (" << result.all.failed_prompts << " failed)";
  if (environments.size() > 1) {
    for (const auto& [name, r] : result.environments)
      log << "; " << name << " " << r.reward_mean << " +- " << r.reward_stderr;
  }
  log << ", " << result.seconds << " s" << std::endl;
  return result;
}

}  // namespace loom::rl
