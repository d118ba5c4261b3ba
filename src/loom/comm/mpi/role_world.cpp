#include "loom/comm/role_world.h"

#include "loom/comm/mpi/role_world.h"
#include "loom/comm/mpi/util.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {
MPI_Comm role_comm = MPI_COMM_NULL;
}  // namespace

namespace mpi_detail {
MPI_Comm job_world() { return role_comm == MPI_COMM_NULL ? MPI_COMM_WORLD : role_comm; }
bool joined_role_world() { return role_comm != MPI_COMM_NULL; }
}  // namespace mpi_detail

RoleWorld join_role_world(int role) {
  LOOM_CHECK(role >= 0, "join_role_world: role " + std::to_string(role) + " must be >= 0");
  LOOM_CHECK(role_comm == MPI_COMM_NULL, "join_role_world: this process already joined its role's world");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    mpi_detail::mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  } else {
    MPI_Query_thread(&provided);
  }
  LOOM_CHECK(provided >= MPI_THREAD_MULTIPLE,
             "the MPI library does not provide MPI_THREAD_MULTIPLE, which the mpi backend needs (use an MPI built with "
             "thread support, e.g. Open MPI >= 3)");
  RoleWorld out;
  MPI_Comm_rank(MPI_COMM_WORLD, &out.job_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &out.job_size);
  mpi_detail::mpi_check(MPI_Comm_split(MPI_COMM_WORLD, role, out.job_rank, &role_comm), "MPI_Comm_split by role");
  MPI_Comm_rank(role_comm, &out.rank);
  MPI_Comm_size(role_comm, &out.size);
  return out;
}

bool in_role_world() { return role_comm != MPI_COMM_NULL; }

void leave_role_world() {
  if (role_comm == MPI_COMM_NULL) return;
  MPI_Comm_free(&role_comm);
  role_comm = MPI_COMM_NULL;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace loom::comm
