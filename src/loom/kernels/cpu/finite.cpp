#include "loom/kernels/cpu/finite.h"

#include <bit>

#include "loom/kernels/parallel.h"

namespace loom::kernels::cpu {

bool any_non_finite(const float* x, int64_t n) {
  uint32_t found = 0;
#pragma omp parallel for schedule(static) reduction(| : found) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    found |= static_cast<uint32_t>((std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u);
  }
  return found != 0;
}

}  // namespace loom::kernels::cpu
