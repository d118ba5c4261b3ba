#pragma once
// Several programs in one MPI job (mpirun MPMD `-np 1 A : -np 2 B`, `srun --multi-prog`, a
// heterogeneous Slurm job): every process of the job joins the part of its world that runs the
// same role (an MPI_Comm_split of the job's world by role). From then on that part is the
// `world` of the mpi backend's run_mpi in this process, so that a program running ranks of its
// own (a trainer) sees only its own processes.
#include <memory>
#include <string>

#include "loom/comm/communicator.h"

namespace loom::comm {

struct RoleWorld {
  int rank = 0;      // this process among the processes of its role
  int size = 1;      // processes of its role
  int job_rank = 0;  // this process in the whole job
  int job_size = 1;
};

// Initialises MPI (MPI_THREAD_MULTIPLE) and splits the job's world by `role` (>= 0), ranks
// kept in the job's order. Collective over every process of the job: each calls it once, at
// start, with its own role. Throws loom::Error when MPI cannot be initialised or it is called
// twice. `shared`: a second split, of the processes of several roles that exchange data
// (`shared` >= 0; -1: not a member), ordered by `shared_key` (then job rank).
RoleWorld join_role_world(int role, int shared = -1, int shared_key = 0);
// The members of this process's `shared` split as a Communicator of the mpi backend (a group of
// its own over a dup): collective over them. Throws when this process joined no shared split.
std::unique_ptr<Communicator> shared_communicator(const std::string& name, const CommOptions& options);
// Whether join_role_world was called in this process (and leave_role_world not yet).
bool in_role_world();
// Frees the role's part and finalises MPI. Every process of the job calls it at its end (MPI's
// finalisation may wait for the others); a process that fails exits without it, and the
// launcher ends the job.
void leave_role_world();

}  // namespace loom::comm
