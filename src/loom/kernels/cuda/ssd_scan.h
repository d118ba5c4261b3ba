#pragma once
// Mamba-2's chunked state-space scan (SSD) on the device, with the contracts of kernels::cpu
// (ssd_scan.h) and its algorithm: a row's blocks of at most s.chunk tokens, cut again at every
// document start (where the state restarts at zero), each block's output as the masked quadratic
// form plus the entering state's term, the state carried from block to block; everything inside
// a block in double. Forward: one thread block per (row, head), walking the row's blocks in order
// with the threads over (token, head_dim) and (head_dim, state); C_t . B_j computed once per
// (row, group) for both passes. Backward: the entering states recomputed by the forward's kernel
// (one per (row, head)), then one thread block per (row, head) walking the blocks backwards, each
// head writing its share of B's and C's gradients (shared by the group's heads) into scratch in
// double, then a pass adding the group's heads' shares in head order, as the CPU sums them; the
// per-head parameter gradients are summed over the rows in order. No atomics: deterministic. The
// shares take 2 x batch x heads x seq x state doubles (1 GiB at batch 1, 128 heads, seq 4096,
// state 128).
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void ssd_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                      const float* B, const float* C, const float* D, const SsdShape& s, const int32_t* documents,
                      cudaStream_t stream = nullptr);
void ssd_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC, float* dD,
                       const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                       const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                       const int32_t* documents, cudaStream_t stream = nullptr);
// s.seq more tokens per sequence from and back into `state` (cpu/ssd_scan.h). One (decoding): one
// thread per (row, head, head_dim element); more (a prompt's chunk): the forward's chunked scan,
// its first block continuing the state and the state after the last token written back.
void ssd_scan_step(float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                   const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                   const SsdShape& s, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
