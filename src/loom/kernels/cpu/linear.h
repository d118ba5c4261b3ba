#pragma once
// y = x W^T + b, with W stored [out, in] as in Hugging Face checkpoints. GEMMs go to OpenBLAS.
// Convention for the backward kernels in loom: gradients are *added* into their outputs, so
// residual streams and gradient accumulation need no extra copies; callers zero what is new
// (the MLP activations' backwards, activation.h, write theirs instead).
#include <cstdint>

namespace loom::kernels::cpu {

// out[n, OC] (+)= in[n, IC] . weight[OC, IC]^T (+ bias[OC] when bias != nullptr); with
// `accumulate` the result is added to out (a residual connection for free).
void linear_forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features, bool accumulate = false);

// din += dout . W ; dweight += dout^T . in ; dbias += sum over rows of dout.
// Any of din, dweight, dbias may be nullptr to skip it. `accumulate_din` false: din = dout . W,
// written whole (a gradient with no other contribution needs no zeroing first).
void linear_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features,
                     bool accumulate_din = true, bool accumulate_dweight = true);

// sums[c] += the sum over rows of x[r, c], in kernels/column_sums.h's order (the bias gradient).
void add_column_sums(float* sums, const float* x, int64_t rows, int64_t cols);

// x[rows, width] += bias[width] on every row.
void add_bias(float* x, const float* bias, int64_t rows, int64_t width);

// c[m, n] (+)= a[m, k] . b[n, k]^T  (accumulate when `accumulate`); plain GEMM for attention etc.
void gemm_nt(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool accumulate);

// c[m, n] (+)= op(a) . op(b), op(a) [m, k] and op(b) [k, n], op = transpose when asked; a and b
// are stored row-major as they are before op (a [k, m] when trans_a, b [n, k] when trans_b).
void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
          bool accumulate);

}  // namespace loom::kernels::cpu
