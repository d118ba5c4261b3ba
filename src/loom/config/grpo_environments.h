#pragma once
// The environments of a GRPO run, resolved: grpo.environments with each entry's zeros and empty
// strings replaced by the run's grpo key of that name (grpo.environment for the task,
// grpo.environment_servers for servers) and each name filled (the task's when it has none), or,
// without that list, the one environment of those keys. Environment server processes are
// numbered across the environments in order (environment i's servers follow those of 0 .. i-1):
// how a launcher's `--role environment` process of index p knows which task it serves.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/grpo_config.h"

namespace loom::config {

std::vector<GrpoEnvironment> run_environments(const GrpoConfig& grpo);

// Environment server processes in all.
int environment_server_count(const GrpoConfig& grpo);

// For messages, the key that sets that count: "grpo.environment_servers" or "grpo.environments[i].servers".
std::string environment_servers_key(const GrpoConfig& grpo);

// The environment (index into run_environments) that server process `server` serves.
int environment_of_server(const GrpoConfig& grpo, int server);

// The most tokens one sample can be trained on: the largest max_turns x max_tokens of the
// environments (seq_mean_token_sum_norm's length).
int64_t max_sample_tokens(const GrpoConfig& grpo);

}  // namespace loom::config
