#include "loom/cli/cli.h"
#include "loom/core/blas_cpu.h"
#ifdef LOOM_WITH_CUDA
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda_entries.h"
#endif

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
#ifdef LOOM_WITH_CUDA
  loom::kernels::set_cuda_starter(&loom::kernels::cuda::start_backend);  // runtime.device: cuda
#endif
  return loom::cli::run(argc, argv);
}
