#pragma once
// The agent loop's options for one episode of a GRPO run: the worker and environment it uses
// (round-robin by `turn`), the rollouts' sampling settings and timeouts, and a seed fixed by
// (train.seed, prompt index, attempt). Validation starts from the same and changes what it samples.
#include <cstddef>
#include <cstdint>

#include "loom/config/run_config.h"
#include "loom/rl/agent_loop.h"
#include "loom/rl/controller/roles.h"

namespace loom::rl {

AgentOptions episode_options(const config::RunConfig& config, const Roles& roles, size_t turn, int64_t index,
                             int attempt);

}  // namespace loom::rl
