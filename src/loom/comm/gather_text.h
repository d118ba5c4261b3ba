#pragma once
// Gathering one string per rank (JSON descriptions, ...) to a root over point-to-point messages.
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::comm {

// Collective over `group`: on `root`, every rank's text in rank order; {} elsewhere.
std::vector<std::string> gather_text(const std::string& text, Communicator& group, int root);

}  // namespace loom::comm
