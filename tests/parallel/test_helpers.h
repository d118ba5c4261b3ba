#pragma once
// Shared by the parallel tests: a flat parameter layout of awkward sizes and seeded random data.
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/optim/adamw.h"
#include "loom/parallel/data/grad_buckets.h"
#include "support/thread_ranks.h"

namespace loom::parallel::testing {

// Back-to-back parameters of the given sizes, registration order.
inline std::vector<ParamRange> ranges(const std::vector<int64_t>& sizes) {
  std::vector<ParamRange> out;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    out.push_back({offset, n});
    offset += n;
  }
  return out;
}

inline int64_t total(const std::vector<ParamRange>& params) {
  return params.empty() ? 0 : params.back().offset + params.back().numel;
}

// One segment per parameter; every other one without weight decay (as norms would be).
inline std::vector<optim::Segment> segments(const std::vector<ParamRange>& params) {
  std::vector<optim::Segment> out;
  for (size_t i = 0; i < params.size(); ++i) out.push_back({params[i].offset, params[i].numel, i % 2 == 0});
  return out;
}

// Normal(0, scale) values, the same for the same seed on every thread.
inline std::vector<float> random_values(uint64_t seed, int64_t n, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(rng);
  return out;
}

using loom::testing::threads;

}  // namespace loom::parallel::testing
