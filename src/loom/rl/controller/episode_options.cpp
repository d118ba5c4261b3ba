#include "loom/rl/controller/episode_options.h"

namespace loom::rl {

AgentOptions episode_options(const config::RunConfig& config, const Roles& roles, size_t turn, int64_t index,
                             int attempt) {
  const config::GrpoConfig& g = config.grpo;
  AgentOptions o;
  o.model_url = roles.worker_url(turn);
  o.environment_url = roles.environment_url(turn);
  o.samples = g.samples_per_prompt;
  o.max_turns = g.max_turns;
  o.max_tokens = g.max_tokens;
  o.temperature = g.temperature;
  o.top_p = g.top_p;
  o.seed = static_cast<uint64_t>(config.train.seed) * 1000003ULL + static_cast<uint64_t>(index) * 7919ULL +
           static_cast<uint64_t>(attempt);
  o.generation_timeout_s = g.generation_timeout_s;
  o.environment_timeout_s = g.environment_timeout_s;
  return o;
}

}  // namespace loom::rl
