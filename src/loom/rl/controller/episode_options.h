#pragma once
// The agent loop's options for one episode of a GRPO run: the worker and a server of the prompt's
// environment it uses (round-robin by `turn`), the rollouts' sampling settings and timeouts (the
// environment's turns and tokens), and a seed fixed by (train.seed, environment, task index,
// attempt). Validation starts from the same and changes what it samples.
#include <cstddef>
#include <cstdint>

#include "loom/config/run_config.h"
#include "loom/rl/agent_loop.h"
#include "loom/rl/controller/prompt_mix.h"
#include "loom/rl/controller/roles.h"

namespace loom::rl {

AgentOptions episode_options(const config::RunConfig& config, const Roles& roles, size_t turn,
                             const EnvironmentPrompt& prompt, int attempt);

}  // namespace loom::rl
