#include "loom/comm/role_world.h"

#include "loom/comm/mpi/arrival.h"
#include "loom/comm/mpi/backend.h"
#include "loom/comm/mpi/communicator.h"
#include "loom/comm/mpi/role_world.h"
#include "loom/comm/mpi/util.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {
MPI_Comm role_comm = MPI_COMM_NULL;
MPI_Comm shared_comm = MPI_COMM_NULL;
}  // namespace

namespace mpi_detail {
MPI_Comm job_world() { return role_comm == MPI_COMM_NULL ? MPI_COMM_WORLD : role_comm; }
bool joined_role_world() { return role_comm != MPI_COMM_NULL; }
}  // namespace mpi_detail

RoleWorld join_role_world(int role, int shared, int shared_key) {
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
  mpi_detail::mpi_check(MPI_Comm_split(MPI_COMM_WORLD, shared >= 0 ? shared : MPI_UNDEFINED, shared_key, &shared_comm),
                        "MPI_Comm_split of the roles that exchange data");
  return out;
}

std::unique_ptr<Communicator> shared_communicator(const std::string& name, const CommOptions& options) {
  LOOM_CHECK(shared_comm != MPI_COMM_NULL, "communicator '" + name + "': this process is in no MPI job shared with other roles");
  MPI_Comm comm = MPI_COMM_NULL;
  mpi_detail::mpi_check(MPI_Comm_dup(shared_comm, &comm), "MPI_Comm_dup of the shared roles");
  MpiOptions mpi;
  mpi.comm = options;
  return std::make_unique<mpi_detail::MpiCommunicator>(mpi_detail::Group::create(comm, name, mpi));
}

bool in_role_world() { return role_comm != MPI_COMM_NULL; }

void leave_role_world() {
  if (role_comm == MPI_COMM_NULL) return;
  mpi_detail::free_retired_windows();  // a shared communicator's: collective with its other roles
  MPI_Comm_free(&role_comm);
  role_comm = MPI_COMM_NULL;
  if (shared_comm != MPI_COMM_NULL) MPI_Comm_free(&shared_comm);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace loom::comm
