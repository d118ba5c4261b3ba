#include "loom/rl/controller/episode_options.h"

namespace loom::rl {

AgentOptions episode_options(const config::RunConfig& config, const Roles& roles, size_t turn,
                             const EnvironmentPrompt& prompt, int attempt) {
  const config::GrpoConfig& g = config.grpo;
  const config::GrpoEnvironment& environment = roles.environment(prompt.environment);
  AgentOptions o;
  o.model_url = roles.worker_url(turn);
  o.environment_url = roles.environment_url(prompt.environment, turn);
  o.environment_name = environment.name;
  o.environment_task = environment.task;
  o.samples = g.samples_per_prompt;
  o.max_turns = environment.max_turns;
  o.max_tokens = environment.max_tokens;
  o.temperature = g.temperature;
  o.top_p = g.top_p;
  // Environment 0's seeds are a run of one environment's: prompt index = task index.
  o.seed = static_cast<uint64_t>(config.train.seed) * 1000003ULL + static_cast<uint64_t>(prompt.task_index) * 7919ULL +
           static_cast<uint64_t>(attempt) + static_cast<uint64_t>(prompt.environment) * 2654435761ULL;
  o.generation_timeout_s = g.generation_timeout_s;
  o.environment_timeout_s = g.environment_timeout_s;
  return o;
}

}  // namespace loom::rl
