#pragma once
// Which environment each prompt of a GRPO run comes from, and which of that environment's tasks
// (docs/grpo.md, "Several environments"). The run's prompts are numbered 0, 1, 2, ... as the
// rollout threads draw them; prompt n goes to the environment that sample n of a blend weighted
// by the environments' weights reads (data::BlendIndex: each environment's share of any prefix
// of the run within about one prompt of its weight's, the environments interleaved), and is that
// environment's k-th prompt: its task index k. With one environment, prompt n is task n.
#include <cstdint>
#include <vector>

#include "loom/config/grpo_config.h"
#include "loom/data/blend_index.h"

namespace loom::rl {

struct EnvironmentPrompt {
  int environment = 0;     // index into config::run_environments
  int64_t task_index = 0;  // the environment's own prompt index (its /seed_session index)
};

class PromptMix {
 public:
  explicit PromptMix(const config::GrpoConfig& grpo);
  EnvironmentPrompt at(int64_t prompt) const;

 private:
  static std::vector<double> weights(const config::GrpoConfig& grpo);
  data::BlendIndex blend_;
};

}  // namespace loom::rl
