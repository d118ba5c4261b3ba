#pragma once
// One linear layer's sizes per precision recipe for the GPU tests: tokens, input and output
// features that are multiples of 16 for the per-tensor FP8 recipes (cuBLASLt's rule) and of 128
// for fp8_blockwise (whole scale blocks), and awkward sizes where any size is taken.
#include <cstdint>

#include "loom/model/linear_precision.h"

namespace loom::kernels::cuda::testing {

struct Sizes {
  int64_t n, in, out;
};

inline Sizes sizes_for(model::Recipe r) {
  if (r == model::Recipe::Fp8Delayed || r == model::Recipe::Fp8Current) return {96, 160, 208};
  if (r == model::Recipe::Fp8Blockwise) return {256, 384, 256};
  return {77, 200, 136};
}

}  // namespace loom::kernels::cuda::testing
