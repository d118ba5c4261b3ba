#pragma once
// When a kernel's work is too small, the fork/join of an OpenMP region costs more than it saves
// (and with busy cores, far more): kernels pass `if(worth_parallel(work))` to their regions.
#include <cstdint>

#include "loom/kernels/parallel.h"

namespace loom::kernels::cpu {

using kernels::kMinParallelWork;
using kernels::worth_parallel;

}  // namespace loom::kernels::cpu
