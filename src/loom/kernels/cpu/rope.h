#pragma once
// Rotary position embedding, Hugging Face Llama convention ("rotate_half": element i pairs
// with i + head_dim/2), applied in place to the q and k heads of rows of a fused qkv tensor.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

using kernels::RopeTable;  // cos/sin tables [max_positions, head_dim/2]

// Rotates `heads` heads (each head_dim wide) starting at column `first_col` of each row; row r
// of `rows` has position positions[r] when `positions` is non-null (packed documents), else
// positions_start + (r % seq) (rows are [batch, seq] flattened).
void rope_forward(float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                  int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions = nullptr);
// The inverse rotation, applied to gradients in place.
void rope_backward(float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                   int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions = nullptr);
// rope_forward on a bf16 tensor (row_stride in elements): the heads widened, rotated in fp32 and
// rounded back to bf16 (kernels::rope_forward_bf16).
void rope_forward_bf16(void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                       int64_t positions_start, const RopeTable& table, const int32_t* positions = nullptr);

}  // namespace loom::kernels::cpu
