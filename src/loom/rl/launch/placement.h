#pragma once
// Where a role process started by a launcher (grpo.launch = external) stands: its index among
// the processes of its role, and their count.
//
// Under an MPI launcher (mpirun MPMD `-np 1 loom grpo --role controller C : -np 2 loom grpo
// --role learner C ...`, `srun --multi-prog`, a heterogeneous Slurm job; comm::detect_backend
// says `mpi`), every process of the job joins its role's part of the job's world
// (comm/role_world.h): the index is its rank there, the count the part's size, and the learner's
// ranks see only each other. Otherwise (one process per launcher step, or started by hand) the
// index is SLURM_PROCID when set, else 0.
#include <string>

#include "loom/config/run_config.h"

namespace loom::rl {

struct RolePlacement {
  std::string role;  // controller | environment | generation | learner
  int index = 0;
  int count = 1;     // processes of this role the launcher started (1 when it cannot tell)
  int job_rank = -1; // in the MPI job; -1 outside one
  bool mpi = false;  // joined its role's part of an MPI job's world
};

// The roles `loom grpo --role` knows; an unknown one is an Error naming the valid ones.
void check_role_name(const std::string& role);

// Places this process (joining the MPI job's role world when there is one) and checks the
// count against the config: one controller; the environments' servers (grpo.environment_servers,
// or those of grpo.environments) and
// grpo.generation_workers workers (an MPI job starts exactly that many; otherwise the index
// must be below it).
RolePlacement place_role(const std::string& role, const config::RunConfig& config);

}  // namespace loom::rl
