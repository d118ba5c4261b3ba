// loom grpo CONFIG.yaml [section.key=value ...]                   the controller (starts every role)
// loom grpo --role learner CONFIG.yaml [section.key=value ...]    the learner ranks (started by it)
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/cli/serve_until_signal.h"
#include "loom/config/run_config.h"
#include "loom/rl/controller/controller.h"
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
}  // namespace

void register_grpo(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    std::string config, role = "controller", grpo_dir;
    std::vector<std::string> overrides;
    int learner_restarts = 3, port = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("grpo", "asynchronous GRPO: environments, generation workers, learner and controller (docs/grpo.md)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("config", args->config, "YAML recipe (grpo.* keys)")->required();
  cmd->add_option("overrides", args->overrides, "section.key=value overrides");
  cmd->add_option("--role", args->role, "controller (starts every role) or learner (started by the controller)")
      ->check(CLI::IsMember({"controller", "learner"}));
  cmd->add_option("--grpo-dir", args->grpo_dir, "learner: the controller's run.dir/grpo (default: this config's)");
  cmd->add_option("--learner-restarts", args->learner_restarts, "controller: restarts of a dead learner (loom launch --max-restarts)")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--port", args->port, "controller: its HTTP port for the learner (0: any)")->check(CLI::Range(0, 65535));
  commands.push_back({cmd, [args] {
                        const config::RunConfig config = config::load_config(args->config, args->overrides);
                        if (args->role == "learner") {
                          rl::run_learner(config, args->grpo_dir.empty() ? config.run.dir + "/grpo" : args->grpo_dir, std::cout);
                          return 0;
                        }
                        rl::ControllerOptions options;
                        options.loom_binary = this_executable();
                        options.initial_checkpoint = config.train.init_from;
                        options.port = args->port;
                        options.learner_command =
                            learner_command(options.loom_binary, args->config, args->overrides, config, args->learner_restarts);
                        rl::Controller controller(config, options, std::cout);
                        int status = 0;
                        serve_until_signal([&] { status = controller.run(); }, [&] { controller.request_stop(); });
                        return status;
                      }});
}

}  // namespace loom::cli
