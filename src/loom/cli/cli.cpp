#include "loom/cli/cli.h"

#include <cstdlib>
#include <iostream>
#include <new>

#include "loom/cli/command.h"
#include "loom/comm/launch.h"
#include "loom/core/error.h"

namespace loom::cli {

int run(int argc, char** argv) {
  CLI::App app{"loom: train transformer language models on CPUs, clusters and GPUs"};
  app.require_subcommand(1);
  const std::string commit = LOOM_GIT_COMMIT;
  app.set_version_flag("--version", std::string("loom ") + LOOM_VERSION + (commit.empty() ? "" : " (commit " + commit + ")"),
                       "print the version (and the git commit of the build) and exit");
  std::vector<Command> commands;
  register_train(app, commands);
  register_data(app, commands);
  register_generate(app, commands);
  register_serve(app, commands);
  register_ckpt(app, commands);
  register_mesh(app, commands);
  register_plan(app, commands);
  register_bench(app, commands);
  register_launch(app, commands);
  register_convert(app, commands);
  register_eval(app, commands);
  register_tokenize(app, commands);
  register_env(app, commands);
  register_grpo(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.action();
    }
  } catch (const comm::AbandonedRanks& e) {
    // Rank threads still run (stuck outside a collective): end the process without waiting.
    std::cerr << "loom: error: " << e.what() << std::endl;
    std::cout.flush();
    std::_Exit(1);
  } catch (const Error& e) {
    std::cerr << "loom: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "loom: error: out of host memory (an allocation failed)" << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "loom: unexpected error: " << e.what() << std::endl;
    return 2;
  }
  std::cerr << "loom: no command given (try loom --help)" << std::endl;
  return 1;
}

}  // namespace loom::cli
