#pragma once
// Mamba-2's scan on the GPU in the SSD algorithm's chunk-parallel form (kernels/ssd_chunks_scan.h):
// every chunk's products at once as cuBLAS batched DGEMMs (an H100's FP64 tensor cores: 67
// TFLOP/s), the element steps as kernels of one thread per index, only the passing of the states
// from chunk to chunk in order. The contracts of ssd_scan.h (kernels/cpu/ssd_scan.h), in double as
// there; the work memory is at most 256 MiB a call (the heads taken in slices) but for one head's.
//
// ssd_scan.h's entries take this form or the (row, head) loops by `LOOM_SSD_SCAN`: `loops` (the
// default until the GPU measures the forms), `chunks`, or `chunks-tf32` (the work arrays in fp32,
// the products on TF32 tensor cores with fp32 accumulation: about 8x the FP64 tensor cores' rate,
// at TF32's 10-bit mantissa, bf16-level tolerance rather than fp32's), or a value set in code.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void ssd_chunk_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                            const float* B, const float* C, const float* D, const SsdShape& s,
                            const int32_t* documents, cudaStream_t stream = nullptr);
void ssd_chunk_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC,
                             float* dD, const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                             const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                             const int32_t* documents, cudaStream_t stream = nullptr);
// A prompt's chunk of s.seq > 1 tokens per sequence continuing `state` and written back into it.
void ssd_chunk_scan_continue(float* y, float* state, const float* x, const float* dt_raw, const float* dt_bias,
                             const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                             cudaStream_t stream = nullptr);

enum class SsdScanForm { Loops = 1, Chunks = 2, ChunksTf32 = 3 };
SsdScanForm ssd_scan_form();
bool ssd_scan_in_chunks();  // Chunks or ChunksTf32
// 0: back to the environment's.
void set_ssd_scan_form(int form);

}  // namespace loom::kernels::cuda
