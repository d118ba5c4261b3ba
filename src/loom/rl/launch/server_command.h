#pragma once
// The command of a GRPO role's server: `loom env serve` for an environment, `loom serve` for a
// generation worker, as the controller (grpo.launch = local) or a role's supervisor
// (external) starts it, on a free port.
#include <string>
#include <vector>

#include "loom/config/run_config.h"

namespace loom::rl {

// `role`: "environment" or "generation"; `index`: the process's among its role's (an environment
// server serves the environment config::environment_of_server names); `checkpoint`: the weights a
// worker starts from; `host`: the address it listens on (empty: the server's default, this
// machine only).
std::vector<std::string> server_command(const config::RunConfig& config, const std::string& role, int index,
                                        const std::string& loom, const std::string& checkpoint, const std::string& host);

// "http://0.0.0.0:PORT" as other nodes reach it: "http://<host>:PORT".
std::string url_on_host(const std::string& url, const std::string& host);

}  // namespace loom::rl
