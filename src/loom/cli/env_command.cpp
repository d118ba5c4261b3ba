// loom env serve --task arithmetic|countdown|calculator [--host H] [--port P] [--port-file F]
//                [--seed S] [--digits D] [--numbers K]
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/cli/serve_until_signal.h"
#include "loom/core/atomic_file.h"
#include "loom/rl/env/env_server.h"

namespace loom::cli {

void register_env(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    rl::EnvironmentOptions environment;
    std::string host = "127.0.0.1", port_file;
    int port = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* env = app.add_subcommand("env", "GRPO environments as HTTP services (docs/grpo.md)");
  env->require_subcommand(1);
  CLI::App* cmd = env->add_subcommand("serve", "serve one environment: /seed_session, /verify, its tools, /health");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--task", args->environment.task, "arithmetic, countdown or calculator")
      ->check(CLI::IsMember(rl::environment_kinds()));
  cmd->add_option("--host", args->host, "address to listen on");
  cmd->add_option("--port", args->port, "port (0: any free one, printed on stdout)")->check(CLI::Range(0, 65535));
  cmd->add_option("--port-file", args->port_file, "also write the port to this file (atomically) once listening");
  cmd->add_option("--seed", args->environment.seed, "task i depends only on (seed, i)");
  cmd->add_option("--digits", args->environment.digits, "arithmetic, calculator: operands of up to D digits")->check(CLI::Range(1, 9));
  cmd->add_option("--numbers", args->environment.numbers, "countdown: how many numbers are given")->check(CLI::Range(2, 8));
  commands.push_back({cmd, [args] {
                        rl::EnvironmentServer server(rl::make_environment(args->environment), args->host, args->port);
                        serve_until_signal(
                            [&] {
                              server.run([&](int port) {
                                if (!args->port_file.empty()) write_file_atomic(args->port_file, std::to_string(port) + "\n");
                                std::cout << "loom env serve: listening on http://" << args->host << ":" << port
                                          << " (environment '" << args->environment.task << "')" << std::endl;
                              });
                            },
                            [&] { server.stop(); });
                        return 0;
                      }});
}

}  // namespace loom::cli
