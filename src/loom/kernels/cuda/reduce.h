#pragma once
// Global-norm clipping on the device, with the contracts of kernels::cpu (adamw.h):
// sum_of_squares returns sum(x^2) as a double (each square exact in fp64, partial sums over
// fixed blocks of 4096 elements, added by one block in a fixed tree: deterministic, the CPU's up
// to fp64 rounding; waits for the stream; Inf or NaN exactly when some x[i] is, no finite square
// overflowing fp64: the precision step's check of the gradients), scale_in_place multiplies by a
// factor; and add_in_place, with which ZeRO's reduced gradient shards accumulate over micro-batches.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

double sum_of_squares(const float* x, int64_t n, cudaStream_t stream = nullptr);
void scale_in_place(float* x, int64_t n, float factor, cudaStream_t stream = nullptr);
// y += x, element by element (one rounding each, as the CPU).
void add_in_place(float* y, const float* x, int64_t n, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
