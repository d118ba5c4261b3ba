#include "loom/cli/cli.h"
#include "loom/core/blas_cpu.h"

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
  return loom::cli::run(argc, argv);
}
