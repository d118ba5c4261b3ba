#include "loom/rl/controller/validation.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <ostream>
#include <thread>
#include <vector>

#include "loom/rl/agent_loop.h"
#include "loom/rl/controller/episode_options.h"

namespace loom::rl {

nlohmann::json ValidationResult::to_json() const {
  return {{"weight_version", weight_version}, {"reward_mean", reward_mean}, {"reward_stderr", reward_stderr},
          {"prompts", prompts}, {"samples", samples}, {"truncated", truncated}, {"failed_prompts", failed_prompts},
          {"seconds", seconds}};
}

namespace {

// One held-out prompt's rewards, or none when every attempt failed.
std::vector<Rollout> answer(const config::RunConfig& config, Roles& roles, int64_t index, size_t turn) {
  const config::GrpoConfig& g = config.grpo;
  for (int attempt = 0; attempt <= g.episode_retries; ++attempt) {
    // The same seed for a prompt at every validation (attempt 0's): versions differ in their weights only.
    AgentOptions o = episode_options(config, roles, turn + static_cast<size_t>(attempt), index, 0);
    o.samples = g.validation_samples;
    o.temperature = g.validation_temperature;
    o.top_p = g.validation_temperature > 0 ? g.top_p : 1.0;
    try {
      return run_group(o, index).samples;
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
  const int threads = g.rollout_thread_count();
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  double sum = 0.0, sum_squares = 0.0;
  ValidationResult result;
  result.weight_version = weight_version;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int64_t i = next++; i < g.validation_prompts; i = next++) {
        const std::vector<Rollout> samples = answer(config, roles, g.validation_first_index + i, static_cast<size_t>(t));
        std::lock_guard<std::mutex> lock(mutex);
        if (samples.empty()) {
          ++result.failed_prompts;
          continue;
        }
        ++result.prompts;
        for (const Rollout& s : samples) {
          sum += s.reward;
          sum_squares += s.reward * s.reward;
          result.truncated += s.truncated;
          ++result.samples;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  if (result.samples > 0) {
    const double n = static_cast<double>(result.samples);
    result.reward_mean = sum / n;
    const double variance = std::max(0.0, sum_squares / n - result.reward_mean * result.reward_mean);
    result.reward_stderr = result.samples > 1 ? std::sqrt(variance / (n - 1)) : 0.0;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log << "loom grpo: validation of step-" << weight_version << ": reward " << result.reward_mean << " +- "
      << result.reward_stderr << " over " << result.samples << " samples of " << result.prompts << " held-out prompts ("
      << result.failed_prompts << " failed), " << result.seconds << " s" << std::endl;
  return result;
}

}  // namespace loom::rl
