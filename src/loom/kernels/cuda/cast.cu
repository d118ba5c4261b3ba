#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/fp8_format.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/process_setting.h"
#include "loom/kernels/cuda/tiled_cast.cuh"

namespace loom::kernels::cuda {

namespace {

// In: fp32, or bf16 widened exactly (bf16_io.cuh's load). With `amax`, max |in| into it (amax.cuh;
// the same condition for every thread of the block).
template <typename In, typename Out, typename Cast>
__global__ void cast_kernel(const In* __restrict__ in, Out* __restrict__ out, int64_t n, Cast cast, unsigned* amax) {
  float m = 0.0f;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float v = load(in, i);
    m = nan_max(m, fabsf(v));
    out[i] = cast(v);
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// cast_kernel four elements at a time (pack4.cuh; both pointers pack-aligned), then the last n % 4
// one by one: the same codes and amax.
template <typename In, typename Out, typename Cast>
__global__ void cast4_kernel(const In* __restrict__ in, Out* __restrict__ out, int64_t n, Cast cast, unsigned* amax) {
  float m = 0.0f;
  grid_packs(
      n,
      [&](int64_t p) {
        const Pack4<In> a = reinterpret_cast<const Pack4<In>*>(in)[p];
        Pack4<Out> b;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float v = load(a.v, k);
          m = nan_max(m, fabsf(v));
          b.v[k] = cast(v);
        }
        reinterpret_cast<Pack4<Out>*>(out)[p] = b;
      },
      [&](int64_t i) {
        const float v = load(in, i);
        m = nan_max(m, fabsf(v));
        out[i] = cast(v);
      });
  if (amax != nullptr) block_amax_into(amax, m);
}

// Element [r, c] of a row-major tensor, for the tiled transposed cast (read4 / value4: the packed
// kernel's, tiled_cast.cuh).
template <typename In>
struct LoadAt {
  const In* in;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const { return load(in, r * cols + c); }
  struct Reads {
    Pack4<In> x;
  };
  __device__ Reads read4(int64_t r, int64_t c) const { return {pack_at(in + r * cols + c)}; }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = load(a.x.v, k);
  }
  bool packs4() const { return pack4_aligned<In>(in) && cols % 4 == 0; }
};

// out: in cast, transposed when asked; plain (transposed only; may be null): in cast as it lies;
// amax (may be null): max |in| taken from the same read (a capped grid: amax_grid's).
template <CastTo kTo, typename In>
void launch_cast(const In* in, void* out, void* plain, int64_t rows, int64_t cols, bool transpose,
                 const float* scale, float* amax, cudaStream_t stream) {
  const Caster<kTo> cast{scale};
  using Out = typename Caster<kTo>::Out;
  Out* o = static_cast<Out*>(out);
  if (!transpose) {
    const int64_t n = rows * cols;
    auto* amax_word = reinterpret_cast<unsigned*>(amax);
    if (pack4_aligned<In>(in) && pack4_aligned<Out>(o)) {
      const int64_t packs = (n + 3) / 4;
      cast4_kernel<<<amax != nullptr ? amax_grid(packs) : grid_for(packs), kThreads, 0, stream>>>(in, o, n, cast,
                                                                                                  amax_word);
      check_launch("cast4_kernel");
      return;
    }
    cast_kernel<<<amax != nullptr ? amax_grid(n) : grid_for(n), kThreads, 0, stream>>>(in, o, n, cast, amax_word);
    check_launch("cast_kernel");
    return;
  }
  launch_tiled_cast(LoadAt<In>{in, cols}, o, static_cast<Out*>(plain), rows, cols, cast, stream,
                    "transpose_cast_kernel", amax);
}

__device__ inline float rounded(float v, OutputRounding rounding) {
  if (rounding == OutputRounding::Bf16) return __bfloat162float(__float2bfloat16_rn(v));
  if (rounding == OutputRounding::Fp16) return __half2float(__float2half_rn(v));
  return v;
}

// Element [r, c] of a product as finish_kernel adds or stores it: a bf16 source as it is (cuBLASLt
// rounded the fp32 sum already), an fp32 one with the bias added, then rounded as asked.
template <typename In>
__device__ inline float finished(In s, const float* bias, int64_t c, OutputRounding rounding) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    return __bfloat162float(s);
  } else {
    return rounded(bias ? __fadd_rn(s, bias[c]) : s, rounding);
  }
}

// Row by row (launch_over_rows), so the bias's column needs no division. Out: fp32, or bf16 (a
// bf16 output: the value rounded to bf16, stored exactly). `base`: what each value is added to (dst
// itself, or another tensor of dst's shape: a residual stream's input); null: stored.
template <typename In, typename Out = float>
__global__ void finish_kernel(Out* dst, const Out* base, const In* src, const float* __restrict__ bias, int64_t rows,
                              int64_t cols, OutputRounding rounding) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < cols; c += column_stride()) {
      const int64_t i = r * cols + c;
      const float v = finished(src[i], bias, c, rounding);
      store(dst, i, base != nullptr ? __fadd_rn(load(base, i), v) : v);
    }
  }
}

// finish_kernel four columns at a time (pack4.cuh): cols a multiple of 4, dst, base and src pack-aligned.
template <typename In, typename Out = float>
__global__ void finish4_kernel(Out* dst, const Out* base, const In* src, const float* __restrict__ bias, int64_t rows,
                               int64_t cols, OutputRounding rounding) {
  const int64_t packs = cols / 4;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t p = column_start(); p < packs; p += column_stride()) {
      const int64_t at = r * packs + p;
      const Pack4<In> s = reinterpret_cast<const Pack4<In>*>(src)[at];
      float before[4] = {}, v[4];
      if (base != nullptr) load4(base, at, before);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float x = finished(s.v[k], bias, 4 * p + k, rounding);
        v[k] = base != nullptr ? __fadd_rn(before[k], x) : x;
      }
      store4(dst, at, v);
    }
  }
}

// dst = finished(src) (+ base), four columns at a time where the shape and pointers allow.
template <typename In, typename Out>
void launch_finish(Out* dst, const Out* base, const In* src, const float* bias, int64_t rows, int64_t cols,
                   OutputRounding rounding, cudaStream_t stream) {
  if (cols % 4 == 0 && pack4_aligned<Out>(dst) && pack4_aligned<In>(src) &&
      (base == nullptr || pack4_aligned<Out>(base))) {
    const RowsLaunch l = launch_over_rows(rows, cols / 4);
    finish4_kernel<<<l.grid, l.block, 0, stream>>>(dst, base, src, bias, rows, cols, rounding);
  } else {
    const RowsLaunch l = launch_over_rows(rows, cols);
    finish_kernel<<<l.grid, l.block, 0, stream>>>(dst, base, src, bias, rows, cols, rounding);
  }
  check_launch("finish_kernel");
}

template <typename In>
void cast_into(const In* in, void* out, void* plain, int64_t rows, int64_t cols, bool transpose, CastTo to,
               const float* scale, float* amax, cudaStream_t stream) {
  if (rows * cols == 0) return;
  LOOM_CHECK(scale != nullptr || (to != CastTo::E4M3 && to != CastTo::E5M2), "cast_operand: an FP8 cast needs its scale");
  switch (to) {
    case CastTo::F32: return launch_cast<CastTo::F32>(in, out, plain, rows, cols, transpose, scale, amax, stream);
    case CastTo::BF16: return launch_cast<CastTo::BF16>(in, out, plain, rows, cols, transpose, scale, amax, stream);
    case CastTo::F16: return launch_cast<CastTo::F16>(in, out, plain, rows, cols, transpose, scale, amax, stream);
    case CastTo::E4M3: return launch_cast<CastTo::E4M3>(in, out, plain, rows, cols, transpose, scale, amax, stream);
    case CastTo::E5M2: return launch_cast<CastTo::E5M2>(in, out, plain, rows, cols, transpose, scale, amax, stream);
  }
}

int tiled_cast_rows_from_environment() {
  const char* value = std::getenv("LOOM_TILED_CAST_ROWS");
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "64") return 64;
  if (v == "128") return 128;
  throw Error("LOOM_TILED_CAST_ROWS=" + v + ": expected 64 or 128 (the rows of the FP8 transposed casts' tiles)");
}

ProcessSetting tiled_cast_rows_setting(tiled_cast_rows_from_environment);

}  // namespace

int tiled_cast_rows() { return tiled_cast_rows_setting.value(); }

void set_tiled_cast_rows(int rows) {
  LOOM_CHECK(rows == 0 || rows == 64 || rows == 128, "set_tiled_cast_rows(" + std::to_string(rows) +
                                                         "): expected 64, 128, or 0 for the default");
  tiled_cast_rows_setting.set(rows);
}

void cast_operand(const float* in, void* out, int64_t rows, int64_t cols, bool transpose, CastTo to,
                  const float* scale, cudaStream_t stream, float* amax) {
  cast_into(in, out, nullptr, rows, cols, transpose, to, scale, amax, stream);
}

void cast_operand_both(const float* in, void* out, void* out_transposed, int64_t rows, int64_t cols, CastTo to,
                       const float* scale, cudaStream_t stream, float* amax) {
  LOOM_CHECK(out != nullptr && out_transposed != nullptr, "cast_operand_both: both outputs are needed");
  cast_into(in, out_transposed, out, rows, cols, true, to, scale, amax, stream);
}

void cast_operand_both_bf16(const void* in16, void* out, void* out_transposed, int64_t rows, int64_t cols, CastTo to,
                            const float* scale, cudaStream_t stream, float* amax) {
  LOOM_CHECK(out != nullptr && out_transposed != nullptr, "cast_operand_both_bf16: both outputs are needed");
  cast_into(static_cast<const __nv_bfloat16*>(in16), out_transposed, out, rows, cols, true, to, scale, amax, stream);
}

void finish_output(float* dst, const void* src, bool src_bf16, const float* bias, int64_t rows, int64_t cols,
                   OutputRounding rounding, bool accumulate, cudaStream_t stream, const float* addend) {
  if (rows * cols == 0) return;
  LOOM_CHECK(!src_bf16 || (bias == nullptr && rounding == OutputRounding::Bf16),
             "finish_output: a bf16 result takes no bias and is rounded to bf16 already");
  LOOM_CHECK(addend == nullptr || accumulate, "finish_output: an addend is for an accumulating output");
  const float* base = !accumulate ? nullptr : addend != nullptr ? addend : dst;
  if (src_bf16) {
    launch_finish(dst, base, static_cast<const __nv_bfloat16*>(src), bias, rows, cols, rounding, stream);
  } else {
    launch_finish(dst, base, static_cast<const float*>(src), bias, rows, cols, rounding, stream);
  }
}

void finish_output_bf16(void* dst16, const float* src, const float* bias, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  if (rows * cols == 0) return;
  launch_finish(static_cast<__nv_bfloat16*>(dst16), static_cast<const __nv_bfloat16*>(nullptr), src, bias, rows, cols,
                OutputRounding::Bf16, stream);
}

}  // namespace loom::kernels::cuda
