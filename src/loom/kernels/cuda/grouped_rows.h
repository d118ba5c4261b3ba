#pragma once
// Rows added into target rows that may repeat (the embedding's gradient, a mixture of experts'
// combine), in parallel and deterministic: out[t - first, :] += w_r * x[r, :] for every row r whose
// target t = targets[r] lies in [first, first + count), each target's rows in ascending row order,
// so the result is bit for bit the CPU's in-order walk (rounded adds; with a scale, one fused
// multiply-add per element, as the CPU's contracted loop).
//
// How: a stable radix sort (CUB) orders the row numbers by target on the device, keeping row
// order within a target; then a block row per group of equal targets walks its rows, a thread per
// column holding the running sum in a register and loading 8 rows ahead of its adds (a frequent
// id, a byte-level corpus's space or a BPE vocabulary's "the", makes a group of hundreds or
// thousands of rows, whose walk would otherwise wait on each load), the group's end found by a
// binary search. Every element of a target is written by one thread,
// so there are no atomics, and targets run in parallel (one thread per column walking every row
// had left a combine's rows to a few SMs; atomic adds had made the embedding's gradient vary from
// run to run). Scratch comes from the device's stream-ordered pool.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

struct RowsByTarget {
  float* out = nullptr;           // [count, width] target rows (row t - first for target t)
  const float* x = nullptr;       // [rows, x_stride] source rows
  int64_t x_stride = 0;
  const int32_t* targets = nullptr;  // [rows], on the device
  const float* scale = nullptr;      // [rows] or null (plain adds)
  int64_t rows = 0, width = 0;
  int64_t first = 0, count = INT64_MAX;  // the targets out holds; rows aimed elsewhere are skipped
};

void add_rows_by_target(const RowsByTarget& a, cudaStream_t stream);

}  // namespace loom::kernels::cuda
