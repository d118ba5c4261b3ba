// loom ckpt digest DIR
#include <iostream>
#include <memory>

#include "loom/ckpt/digest.h"
#include "loom/cli/command.h"

namespace loom::cli {

void register_ckpt(CLI::App& app, std::vector<Command>& commands) {
  auto path = std::make_shared<std::string>();
  CLI::App* ckpt = app.add_subcommand("ckpt", "checkpoint tools");
  ckpt->require_subcommand(1);
  CLI::App* digest = ckpt->add_subcommand("digest", "one hex digest of the model parameters as global tensors");
  digest->add_option("dir", *path, "checkpoint directory or checkpoint root")->required();
  commands.push_back({digest, [path] {
                        std::cout << ckpt::parameter_digest(*path) << std::endl;
                        return 0;
                      }});
}

}  // namespace loom::cli
