#include "loom/comm/launch.h"

#include <cstdlib>
#include <string>

#include "loom/comm/mpi/backend.h"
#include "loom/comm/threads/backend.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {

bool has_env(const char* name) { return std::getenv(name) != nullptr; }

}  // namespace

std::string detect_backend() {
  // OpenMPI's mpirun, MPICH/PMI and PMIx launchers each export these to every rank.
  if (has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMI_SIZE") || has_env("PMIX_RANK")) return "mpi";
  // srun exports SLURM_PROCID even for one task; only a multi-task step is an MPI job.
  if (has_env("SLURM_PROCID")) {
    const char* tasks = std::getenv("SLURM_NTASKS");
    if (tasks != nullptr && std::atoi(tasks) > 1) return "mpi";
  }
  return "threads";
}

void launch(const LaunchOptions& options, const std::function<void(Communicator& world)>& body) {
  const std::string backend = options.backend == "auto" ? detect_backend() : options.backend;
  if (backend == "threads") {
    run_threads(options, body);
  } else if (backend == "mpi") {
    run_mpi(options, body);
  } else {
    throw Error("runtime.backend '" + options.backend + "' is not known (valid: threads, mpi, auto)");
  }
}

}  // namespace loom::comm
