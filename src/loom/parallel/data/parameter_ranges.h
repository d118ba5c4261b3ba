#pragma once
// How the model's flat parameter buffer is cut up for the optimizer and for checkpoints.
#include <cstdint>
#include <vector>

#include "loom/model/parameters.h"
#include "loom/optim/adamw.h"

namespace loom::parallel {

// Optimizer segments: one per parameter, weight decay where the parameter asks for it.
std::vector<optim::Segment> optimizer_segments(const model::ParameterStore& params);

// A range [begin, end) of this rank's flat parameter buffer whose values and moments it writes
// to a checkpoint, and where they are (each pointer at element `begin`).
struct OwnedRange {
  int64_t begin = 0, end = 0;
  const float* value = nullptr;
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  bool moments_on_host = false;  // the moments in host memory on a GPU run (optim.cpu_offload)
  bool values_on_host = false;   // the values too (ZeRO-3's shards under parallel.offload_params)
};

}  // namespace loom::parallel
