#include "loom/rl/launch/server_command.h"

#include <algorithm>

#include "loom/config/grpo_environments.h"
#include "loom/core/error.h"

namespace loom::rl {

std::vector<std::string> server_command(const config::RunConfig& config, const std::string& role, int index,
                                        const std::string& loom, const std::string& checkpoint, const std::string& host) {
  const config::GrpoConfig& g = config.grpo;
  std::vector<std::string> argv;
  if (role == "environment") {
    const config::GrpoEnvironment e =
        config::run_environments(g).at(static_cast<size_t>(config::environment_of_server(g, index)));
    argv = {loom, "env", "serve", "--task", e.task, "--port", "0", "--seed", std::to_string(config.train.seed),
            "--digits", std::to_string(e.task_digits), "--numbers", std::to_string(e.task_numbers)};
  } else {
    LOOM_CHECK(role == "generation", "server_command: no server for role '" + role + "'");
    // Generation workers run where the learner does (runtime.device).
    argv = {loom, "serve", checkpoint, "--port", "0", "--kv-cache-mb", std::to_string(g.worker_kv_cache_mb),
            "--max-running", std::to_string(std::max(64, g.samples_per_prompt * 4)), "--device",
            config.runtime.device == config::RuntimeDevice::Cuda ? "cuda" : "cpu", "--dtype", g.worker_dtype};
    if (g.worker_speculative_tokens > 0) {  // drafts from the model's multi-token prediction depths
      argv.push_back("--speculative-config");
      argv.push_back("{\"method\": \"mtp\", \"num_speculative_tokens\": " +
                     std::to_string(g.worker_speculative_tokens) + "}");
    }
  }
  if (!host.empty()) {
    argv.push_back("--host");
    argv.push_back(host);
  }
  return argv;
}

std::string url_on_host(const std::string& url, const std::string& host) {
  const size_t colon = url.rfind(':');
  LOOM_CHECK(url.rfind("http://", 0) == 0 && colon != std::string::npos && colon > 7, "not an http://HOST:PORT address: '" + url + "'");
  return "http://" + host + url.substr(colon);
}

}  // namespace loom::rl
