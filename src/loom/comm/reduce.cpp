#include "loom/comm/reduce.h"

#include <algorithm>
#include <cstring>

#include "loom/core/error.h"

namespace loom::comm {

namespace {

// Elements per block: the f32 accumulator of a block (8 KiB) stays in L1 while every source
// streams through it.
constexpr int64_t kBlock = 2048;

// Max that propagates NaN from either side (a plain `x > a` would drop a NaN arriving second).
inline float max_nan(float a, float x) { return (x > a || x != x) ? x : a; }

void combine(float* acc, const float* x, int64_t count, ReduceOp op) {
  if (op == ReduceOp::Max) {
    for (int64_t i = 0; i < count; ++i) acc[i] = max_nan(acc[i], x[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) acc[i] += x[i];
  }
}

}  // namespace

bool reducible(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16; }

void check_reducible(DType dtype, const std::string& what) {
  LOOM_CHECK(reducible(dtype), what + ": dtype " + dtype_name(dtype) + " cannot be reduced (valid: f32, bf16, f16)");
}

void accumulate(float* acc, const void* src, int64_t count, DType dtype, ReduceOp op) {
  if (dtype == DType::F32) {
    combine(acc, static_cast<const float*>(src), count, op);
    return;
  }
  check_reducible(dtype, "accumulate");
  alignas(64) float block[kBlock];
  const auto* s = static_cast<const std::byte*>(src);
  const size_t element = dtype_size(dtype);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    to_f32(block, s + begin * element, n, dtype);
    combine(acc + begin, block, n, op);
  }
}

void finish(void* dst, const float* acc, int64_t count, DType dtype, ReduceOp op, int ranks) {
  if (op != ReduceOp::Avg) {
    from_f32(dst, acc, count, dtype);
    return;
  }
  LOOM_CHECK(ranks > 0, "finish: Avg over " + std::to_string(ranks) + " ranks");
  const float divisor = static_cast<float>(ranks);
  alignas(64) float block[kBlock];
  auto* d = static_cast<std::byte*>(dst);
  const size_t element = dtype_size(dtype);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    for (int64_t i = 0; i < n; ++i) block[i] = acc[begin + i] / divisor;
    from_f32(d + begin * element, block, n, dtype);
  }
}

void reduce_n(void* dst, const void* const* srcs, int n, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, "reduce");
  LOOM_CHECK(n >= 1, "reduce_n: needs at least one source (got " + std::to_string(n) + ")");
  const size_t element = dtype_size(dtype);
  alignas(64) float acc[kBlock];
  auto* d = static_cast<std::byte*>(dst);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t len = std::min(kBlock, count - begin);
    const size_t offset = static_cast<size_t>(begin) * element;
    to_f32(acc, static_cast<const std::byte*>(srcs[0]) + offset, len, dtype);
    for (int q = 1; q < n; ++q) accumulate(acc, static_cast<const std::byte*>(srcs[q]) + offset, len, dtype, op);
    finish(d + offset, acc, len, dtype, op, n);
  }
}

void reduce_into(void* inout, const void* in, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, "reduce_into");
  const size_t element = dtype_size(dtype);
  alignas(64) float acc[kBlock];
  auto* d = static_cast<std::byte*>(inout);
  const auto* s = static_cast<const std::byte*>(in);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t len = std::min(kBlock, count - begin);
    const size_t offset = static_cast<size_t>(begin) * element;
    to_f32(acc, s + offset, len, dtype);
    accumulate(acc, d + offset, len, dtype, op == ReduceOp::Avg ? ReduceOp::Sum : op);
    from_f32(d + offset, acc, len, dtype);
  }
}

}  // namespace loom::comm
