#pragma once
// AdamW on the device: the same update, element for element, as kernels::cpu::adamw_update
// (fp32 throughout, bias corrections computed once on the host), fused into one pass over the
// parameters, gradients and moments. adamw_update_many updates many tensors in one launch (the
// tensors and their steps' hyper-parameters go to the kernel as an argument, kMaxTensorsPerLaunch
// tensors at a time, each naming its step), bit for bit the same as one adamw_update per tensor.
// A tensor's fp8.amax takes max |updated value| in the same pass; an FP8 weight with codes
// (fp8.forward) is updated by a launch of its own through the tiled cast (tiled_cast.cuh), which
// writes its codes in both orientations from the values it updates, as a forward's cast of the
// weight writes them (the same encoding, scale pair and amax).
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

constexpr int kMaxTensorsPerLaunch = 48;

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const kernels::AdamWStep& step, cudaStream_t stream = nullptr);
// Each tensor with steps[its step_index], as kernels::adamw_update_many checked them
// (1 <= step_count <= kMaxAdamWSteps, step indices in range, FP8 weights' shapes and stores).
void adamw_update_many(const kernels::AdamWTensor* tensors, int64_t count, const kernels::AdamWStep* steps,
                       int64_t step_count, cudaStream_t stream = nullptr);
// DiLoCo's outer update: the fused multiply-adds of kernels::cpu::nesterov_outer_update, bit for bit.
void nesterov_outer_update(float* anchor, float* momentum, const float* delta, int64_t n, float lr, float mu,
                           cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
