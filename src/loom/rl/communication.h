#pragma once
// The learner ranks' collectives of a GRPO run (docs/collectives.md): rank 0 fetches a step's
// groups from the controller and every rank gets the same text; under context parallelism, the
// sums over whole samples of GSPO and seq_mask_tis.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::rl {

// Collective over `group`: `text` of `root` on every rank.
std::string broadcast_text(const std::string& text, comm::Communicator& group, int root);

// Collective over `group`: the largest of the ranks' `value`.
int64_t max_over_group(comm::Communicator& group, int64_t value);

// Collective over `group` (the context-parallel ranks, each holding chunks of the same samples):
// every rank's `sums` (the same layout on each) summed in place. They travel as their fp64 bits
// (an all-gather) and every rank adds them in rank order, so all ranks get the same sums.
void sum_samples_over_group(comm::Communicator& group, std::vector<double>& sums);

}  // namespace loom::rl
