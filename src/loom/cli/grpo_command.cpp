// loom grpo CONFIG.yaml [section.key=value ...]                   the controller (starts every role)
// loom grpo --role learner CONFIG.yaml [section.key=value ...]    the learner ranks (started by it)
// With grpo.launch=external a launcher (mpirun MPMD, srun) starts every role:
// loom grpo --role controller|environment|generation|learner CONFIG.yaml [section.key=value ...]
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/cli/memory_advice.h"
#include "loom/cli/serve_until_signal.h"
#include "loom/comm/role_world.h"
#include "loom/config/run_config.h"
#include "loom/rl/controller/controller.h"
#include "loom/rl/launch/placement.h"
#include "loom/rl/launch/role_supervisor.h"
#include "loom/rl/learner_loop.h"

namespace loom::cli {

namespace {

std::string this_executable() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("loom") : path.string();
}

// The learner under `loom launch` (restarted from its checkpoint when it dies), its files in
// run.dir/learner, finding the controller through run.dir/grpo/roles.json.
std::vector<std::string> learner_command(const std::string& loom, const std::string& config_path,
                                         const std::vector<std::string>& overrides, const config::RunConfig& config,
                                         int restarts) {
  std::vector<std::string> argv = {loom, "launch", "--max-restarts", std::to_string(restarts), "--hang-timeout-s", "0",
                                   "--", loom, "grpo", "--role", "learner", "--grpo-dir", config.run.dir + "/grpo", config_path};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  argv.push_back("run.dir=" + config.run.dir + "/learner");
  return argv;
}

struct Args {
  std::string config, role = "controller", grpo_dir;
  std::vector<std::string> overrides;
  int learner_restarts = 3, port = 0;
};

int run_controller(const Args& args, const config::RunConfig& config) {
  rl::ControllerOptions options;
  options.loom_binary = this_executable();
  options.initial_checkpoint = config.train.init_from;
  options.port = args.port;
  if (config.grpo.launch == "local")
    options.learner_command = learner_command(options.loom_binary, args.config, args.overrides, config, args.learner_restarts);
  rl::Controller controller(config, options, std::cout);
  int status = 0;
  serve_until_signal([&] { status = controller.run(); }, [&] { controller.request_stop(); });
  return status;
}

// The learner's ranks. External: its files in run.dir/learner unless --grpo-dir says where the
// controller is (as the local controller starts it).
int run_learner_role(const Args& args, const config::RunConfig& config, const rl::RolePlacement& place) {
  rl::LearnerPlace learner;
  learner.grpo_dir = args.grpo_dir.empty() ? config.run.dir + "/grpo" : args.grpo_dir;
  learner.external = config.grpo.launch == "external";
  learner.job_rank = place.job_rank;
  if (!learner.external || !args.grpo_dir.empty()) {
    rl::run_learner(config, learner, std::cout);
    return 0;
  }
  std::vector<std::string> overrides = args.overrides;
  overrides.push_back("run.dir=" + config.run.dir + "/learner");
  const config::RunConfig own = config::load_config(args.config, overrides);
  LOOM_CHECK(place.count == 1 || own.runtime.backend != config::Backend::Threads,
             "loom grpo --role learner: the launcher started " + std::to_string(place.count) +
                 " learner processes, but runtime.backend = threads would make each a job of its own; use runtime.backend=mpi or auto");
  rl::run_learner(own, learner, std::cout);
  return 0;
}
}  // namespace

void register_grpo(CLI::App& app, std::vector<Command>& commands) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("grpo", "asynchronous GRPO: environments, generation workers, learner and controller (docs/grpo.md)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("config", args->config, "YAML recipe (grpo.* keys)")->required();
  cmd->add_option("overrides", args->overrides, "section.key=value overrides");
  cmd->add_option("--role", args->role,
                  "controller (local: starts every role), learner; with grpo.launch=external also environment, generation");
  cmd->add_option("--grpo-dir", args->grpo_dir, "learner: the controller's run.dir/grpo (default: this config's)");
  cmd->add_option("--learner-restarts", args->learner_restarts, "controller: restarts of a dead learner (loom launch --max-restarts)")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--port", args->port, "controller: its HTTP port for the learner (0: any)")->check(CLI::Range(0, 65535));
  commands.push_back({cmd, [args] {
                        rl::check_role_name(args->role);
                        const config::RunConfig config = config::load_config(args->config, args->overrides);
                        LOOM_CHECK(!config.train.skip_train,
                                   "train.skip_train is for loom train and loom sft: GRPO evaluates held-out prompts "
                                   "with grpo.validation_prompts");
                        const bool external = config.grpo.launch == "external";
                        LOOM_CHECK(external || args->role == "controller" || args->role == "learner",
                                   "loom grpo --role " + args->role +
                                       " needs grpo.launch=external (with grpo.launch=local the controller starts it)");
                        // External: the launcher placed this process; join its role's part of the job.
                        rl::RolePlacement place;
                        place.role = args->role;
                        if (external) place = rl::place_role(args->role, config);
                        int status = 0;
                        if (args->role == "learner") {
                          status = with_memory_advice(training_memory_advice(args->config, args->overrides),
                                                      [&] { return run_learner_role(*args, config, place); });
                        } else if (args->role == "controller") {
                          status = run_controller(*args, config);
                        } else {
                          std::atomic<bool> stop{false};
                          rl::SupervisorOptions options{this_executable(), config.run.dir + "/grpo", place};
                          serve_until_signal([&] { status = rl::supervise_role(config, options, std::cout, stop); }, [&] { stop = true; });
                        }
                        comm::leave_role_world();  // every process of an MPI job ends here together
                        return status;
                      }});
}

}  // namespace loom::cli
