#pragma once
// Element-wise reductions over the dtypes collectives reduce (f32, bf16, f16), shared by the comm
// backends. bf16 and f16 are reduced in f32 and rounded once, to nearest even, when stored, so a
// reduction of N buffers rounds once whatever N is.
//
// Two ways to use them:
// - N-way, as the threads backend does: reduce_n() reads every rank's buffer in rank order and
//   writes the rounded result (Avg divides by N).
// - Staged through f32, as a backend whose library reduces only f32 does: to_f32() each input,
//   let the library sum f32 buffers (or accumulate() them), then finish() divides for Avg and
//   rounds to the dtype once. reduce_into() is the pairwise form of an MPI user-defined op; it
//   rounds at every step, so prefer the f32 staging when "round once" matters.
#include <cstdint>
#include <string>

#include "loom/comm/communicator.h"
#include "loom/core/dtype.h"
#include "loom/core/dtype_convert.h"

namespace loom::comm {

// f32, bf16 and f16: the dtypes collectives can reduce.
bool reducible(DType dtype);
// Throws loom::Error naming `what` (e.g. "all_reduce"), the dtype and the reducible ones.
void check_reducible(DType dtype, const std::string& what);

// The conversions between the reducible dtypes and f32 are core's (core/dtype_convert.h):
// to_f32(dst, src, count, dtype) widens, from_f32(dst, src, count, dtype) rounds to nearest even.
using loom::from_f32;
using loom::to_f32;

// acc[i] = acc[i] (op) f32(src[i]). Avg accumulates as Sum; finish() divides.
void accumulate(float* acc, const void* src, int64_t count, DType dtype, ReduceOp op);
// dst[i] = round(acc[i] / ranks) for Avg, round(acc[i]) otherwise. dst may alias acc for f32.
void finish(void* dst, const float* acc, int64_t count, DType dtype, ReduceOp op, int ranks);

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[n-1][i], accumulated in f32 in that
// order and rounded once; Avg divides by n. dst may be one of srcs (each element is read from
// every source before it is written). The fixed order makes every caller that passes the same
// sources get bitwise the same result.
void reduce_n(void* dst, const void* const* srcs, int n, int64_t count, DType dtype, ReduceOp op);

// inout[i] = round(f32(in[i]) (op) f32(inout[i])): the shape of an MPI user-defined op (Avg is
// treated as Sum; divide afterwards with finish() or a scale).
void reduce_into(void* inout, const void* in, int64_t count, DType dtype, ReduceOp op);

}  // namespace loom::comm
