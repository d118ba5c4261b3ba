#pragma once
// The transfers of the mpi backend's data collectives (phase 2, see group.h): what each one runs
// once the handshake proved every rank there. Each is a Transfer (operation.h) and reads its
// arguments from op.call; how they use MPI is described in transfer.cpp.
#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail::transfer {

void all_reduce(Group& group, CollectiveOp& op);
void reduce_scatter(Group& group, CollectiveOp& op);
void reduce(Group& group, CollectiveOp& op);
void all_gather(Group& group, CollectiveOp& op);  // all_gather and all_gather_v
void broadcast(Group& group, CollectiveOp& op);
void all_to_all(Group& group, CollectiveOp& op);  // all_to_all and all_to_all_v
void barrier(Group& group, CollectiveOp& op);

}  // namespace loom::comm::mpi_detail::transfer
