#include <gtest/gtest.h>

#include "loom/core/blas_cpu.h"

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
