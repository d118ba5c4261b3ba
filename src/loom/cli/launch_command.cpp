// loom launch [--max-restarts N] [--hang-timeout-s S] [--grace-s S] [--restart-backoff-s S] [--heartbeat-dir D]
//             [--no-resume] -- COMMAND ...
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/ops/supervisor.h"

namespace loom::cli {

void register_launch(CLI::App& app, std::vector<Command>& commands) {
  auto options = std::make_shared<ops::SupervisorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "run a training job under supervision, restarting it from the latest good checkpoint when a rank dies or "
      "hangs: loom launch [options] -- loom train CONFIG ... (or mpirun/srun ... loom train ...)");
  cmd->add_option("--max-restarts", options->max_restarts, "restarts allowed before giving up")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--hang-timeout-s", options->hang_timeout_s,
                  "seconds without progress of a rank that count as a hang (0 = off)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--grace-s", options->grace_s, "seconds between SIGTERM and SIGKILL when stopping the job")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--restart-backoff-s", options->restart_backoff_s,
                  "seconds to wait before the first restart, doubling for each further one (at most 30 s, or this "
                  "value when larger); 0 = restart at once")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--heartbeat-dir", options->heartbeat_dir,
                  "where ranks write heartbeats (default: a fresh directory under $TMPDIR; multi-node: a shared "
                  "directory)");
  cmd->add_flag("!--no-resume", options->resume, "do not append train.resume=true to restarts");
  cmd->add_option("command", options->command, "the job: after --, e.g. -- loom train CONFIG.yaml key=value")
      ->required();
  commands.push_back({cmd, [options] { return ops::supervise(*options, std::cerr); }});
}

}  // namespace loom::cli
