#pragma once
// The mpi backend's view of comm/role_world.h: the communicator run_mpi takes as its world.
#include "loom/comm/mpi/util.h"

namespace loom::comm::mpi_detail {

// The process's role part when it joined one (join_role_world), else MPI_COMM_WORLD.
MPI_Comm job_world();
bool joined_role_world();

}  // namespace loom::comm::mpi_detail
