#pragma once
// The learner ranks' collectives of a GRPO run (docs/collectives.md): rank 0 fetches a step's
// groups from the controller and every rank gets the same text.
#include <string>

#include "loom/comm/communicator.h"

namespace loom::rl {

// Collective over `group`: `text` of `root` on every rank.
std::string broadcast_text(const std::string& text, comm::Communicator& group, int root);

}  // namespace loom::rl
