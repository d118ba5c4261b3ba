#pragma once
// Per-tensor FP8 codes of a norm's output, cast straight from the norm's input: the contracts of
// kernels::norm_statistics and kernels::norm_forward_codes (ops.h). The statistics pass is the
// forward kernel storing nothing (rmsnorm_statistics / layernorm_statistics), taking under
// fp8_current the amax of the outputs; the codes pass evaluates each output from the input, the
// statistics and the weights inside the tiled transposed cast (produced_codes.cuh). So the codes
// are those cast_operand_both would make from what rmsnorm_forward / layernorm_forward would
// write, and the fp32 output is never written nor read again: per element 8 bytes fewer (its
// write and the cast's read, less a second read of the input), 12 under fp8_current (its amax
// pass too), and the output's 4 bytes of memory not kept.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {

// mean null: RMSNorm (bias unused), else LayerNorm. amax: may be null.
void norm_statistics(float* mean, float* rstd, const float* in, const float* weight, const float* bias, int64_t rows,
                     int64_t dim, float eps, float* amax, cudaStream_t stream = nullptr);
void norm_forward_codes(const float* in, const float* weight, const float* bias, const float* mean, const float* rstd,
                        int64_t rows, int64_t dim, const CastOperand& cast, void* codes, void* transposed,
                        cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
