#include "loom/cli/cli.h"
#include "loom/core/blas_cpu.h"
#ifdef LOOM_WITH_CUDA
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda_entries.h"
#endif
#ifdef LOOM_WITH_NCCL
#include "loom/comm/device_staging.h"
#include "loom/comm/nccl/communicator.h"
#endif

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
#ifdef LOOM_WITH_CUDA
  loom::kernels::set_cuda_starter(&loom::kernels::cuda::start_backend);  // runtime.device: cuda
#endif
#ifdef LOOM_WITH_NCCL
  // runtime.device_comm: nccl; the NCCL group bootstrapped over the run's world (threads or mpi).
  loom::comm::set_device_communicator_factory(
      [](loom::comm::Communicator& bootstrap, loom::Device device, const loom::comm::CommOptions& options) {
        return loom::comm::make_nccl_communicator(bootstrap, device.index, bootstrap.name(), options);
      });
#endif
  return loom::cli::run(argc, argv);
}
