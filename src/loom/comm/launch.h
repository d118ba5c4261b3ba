#pragma once
// Starting the ranks of a job. `threads`: N ranks as threads of this process sharing memory.
// `mpi`: this process is one rank of an mpirun/srun job. `auto`: mpi when the launcher's
// environment says so (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_PROCID with SLURM_NTASKS > 1 ...),
// else threads.
#include <functional>
#include <string>

#include <memory>

#include "loom/comm/communicator.h"
#include "loom/comm/link_model.h"
#include "loom/core/error.h"

namespace loom::comm {

struct LaunchOptions {
  std::string backend = "threads";  // threads | mpi | auto
  int ranks = 1;                    // threads backend only
  CommOptions comm;
  std::shared_ptr<LinkModel> link_model;  // threads backend: simulated topology (null = none)
};

// The backend `auto` resolves to in this environment.
std::string detect_backend();

// The threads backend's failure when some rank did not stop after another failed (it is stuck
// outside a collective, where no timeout reaches it): those threads still run, so the process
// must end at once (std::_Exit) after reporting it.
class AbandonedRanks : public Error {
 public:
  using Error::Error;
};

// Runs `body(world)` on every rank and returns when all have finished. An exception on any rank
// is rethrown here (threads: the first one; the other ranks' pending waits fail rather than hang).
void launch(const LaunchOptions& options, const std::function<void(Communicator& world)>& body);

}  // namespace loom::comm
