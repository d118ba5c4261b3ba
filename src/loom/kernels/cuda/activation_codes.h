#pragma once
// Per-tensor FP8 codes of the MLP activation's output (forward) and of its input gradient
// (backward), cast straight from what the activation reads: kernels::activation_forward_codes /
// activation_backward_codes (ops.h has the contract). The activation's fp32 arithmetic
// (activation_math.cuh, the same as activation.cu's) evaluated per element inside the tiled
// transposed cast (tiled_cast.cuh), so the codes are those cast_operand_both would make from the
// fp32 tensor activation_forward_bf16 / activation_backward_bf16 would write, without writing or
// reading it: under an FP8 block's MLP, 4 bytes fewer per activation element forward (the fp32
// write and read of the activation, less the codes pass's second read of the bf16 input) and 10
// fewer backward.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/precision_gemm.h"
#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void activation_forward_codes(MlpActivation activation, const void* in16, int64_t rows, int64_t width,
                              const CastOperand& cast, void* codes, void* transposed, cudaStream_t stream = nullptr);
void activation_backward_codes(MlpActivation activation, const void* dout16, const void* in16, int64_t rows,
                               int64_t width, const CastOperand& cast, void* codes, void* transposed,
                               cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
