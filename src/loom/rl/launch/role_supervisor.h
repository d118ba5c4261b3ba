#pragma once
// A server role started by a launcher (`loom grpo --role environment|generation CONFIG` with
// grpo.launch = external): the controller cannot start a process on another node, so this
// process starts the role's server (`loom env serve` / `loom serve` from train.init_from, on
// all interfaces, a free port) as its child, registers where it listens
// (RUN/grpo/roles/<role>-<index>.json, the host name, not 127.0.0.1), and keeps it alive:
// a server that ends, or that the controller reports as not answering (a restart request), is
// started again and registered anew (the controller then loads the current weights into a
// worker), up to grpo.max_role_restarts restarts; beyond, the registration says why it gave
// up and this process fails. It ends when the controller's roles.json says the run is
// finished (0) or on `stop` (143).
#include <atomic>
#include <iosfwd>
#include <string>

#include "loom/config/run_config.h"
#include "loom/rl/launch/placement.h"

namespace loom::rl {

struct SupervisorOptions {
  std::string loom_binary;  // the executable the server runs
  std::string grpo_dir;     // RUN/grpo
  RolePlacement placement;  // environment or generation, its index
  double start_timeout_s = 300.0;  // until the server listens
};

int supervise_role(const config::RunConfig& config, const SupervisorOptions& options, std::ostream& log,
                   const std::atomic<bool>& stop);

}  // namespace loom::rl
