#pragma once
// The collectives of a served model whose tensor-parallel ranks are MPI processes
// (docs/collectives.md): rank 0 announces each model operation to the follower ranks, and
// gathers their weight shards for a digest.
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/infer/step_message.h"

namespace loom::infer {

// Collective over `world`: rank 0 passes the message (encoded, then broadcast), every rank
// returns it (decoded). `message` is read on rank 0 only (may be null elsewhere).
StepMessage exchange_step(comm::Communicator& world, const StepMessage* message);

// Collective over `world`: on rank 0, every rank's `shards` bytes in rank order; {} elsewhere.
std::vector<std::string> gather_shards(const std::string& shards, comm::Communicator& world);

}  // namespace loom::infer
