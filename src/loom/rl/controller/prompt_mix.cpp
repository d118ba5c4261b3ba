#include "loom/rl/controller/prompt_mix.h"

#include "loom/config/grpo_environments.h"

namespace loom::rl {

std::vector<double> PromptMix::weights(const config::GrpoConfig& grpo) {
  std::vector<double> out;
  for (const config::GrpoEnvironment& e : config::run_environments(grpo)) out.push_back(e.weight);
  return out;
}

PromptMix::PromptMix(const config::GrpoConfig& grpo) : blend_(weights(grpo)) {}

EnvironmentPrompt PromptMix::at(int64_t prompt) const {
  const data::BlendIndex::Pick pick = blend_.picks(prompt, 1).front();
  return {pick.dataset, pick.sample};
}

}  // namespace loom::rl
