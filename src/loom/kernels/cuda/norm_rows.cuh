#pragma once
// How the norms' kernels (rmsnorm.cu, layernorm.cu) spread rows over a block of kThreads threads:
// a group of 32, 64, 128 or 256 threads per row, kThreads / group rows side by side. Thread `lane`
// of a group takes chunks lane, lane + group, ... of its row, a chunk being 4 elements read as one
// Pack4 (pack4.cuh) where the row allows it, else 1 element. A kernel with Held > 0 keeps each
// thread's chunks (at most Held of them) in registers, so a row is read from memory once; Held = 0
// (rows too wide, or not in packs) reads them again for each pass, a group of kThreads per row.
// Every sum's order follows from (dim, the row's layout) alone, not from the output's type: the
// fp32, bf16 and Discard forms of a forward kernel compute the same statistics bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"

namespace loom::kernels::cuda {

// The layout of a norm's rows over threads (host side).
struct NormRows {
  int width = 1;         // elements per chunk: 4 (a Pack4) or 1
  int group = kThreads;  // threads per row
  int held = 0;          // chunks a thread holds in registers (1..max), or 0: read again per pass
};

// Chunks per thread that the held layouts aim for: 16 elements, 4 loads of 16 bytes in flight per
// array, in a group as narrow as that allows (fewer threads per row, cheaper row sums).
constexpr int kNormChunksPerThread = 4;

// The blocks an SM should hold of a forward kernel holding `held` chunks a thread (its
// __launch_bounds__): 4 (at most 64 registers) up to 4 chunks; 2 else, which keeps ptxas from
// trimming wider kernels to 64 registers with a few bytes of spills.
constexpr int norm_forward_min_blocks(int held) { return held >= 1 && held <= 4 ? 4 : 2; }

// Rows of `dim` elements in packs of 4 when dim % 4 == 0 and every row-major operand in `rows` is
// 16-byte aligned (then every row is); at most `max_held` chunks a thread held, else Held = 0.
inline NormRows norm_rows(int64_t dim, std::initializer_list<const void*> rows, int max_held) {
  bool packs = dim % 4 == 0;
  for (const void* p : rows) packs = packs && pack4_aligned<float>(p);
  NormRows s;
  s.width = packs ? 4 : 1;
  const int64_t chunks = dim / s.width;
  if (!packs || chunks > static_cast<int64_t>(kThreads) * max_held) return s;
  s.group = 32;
  while (s.group < kThreads && static_cast<int64_t>(s.group) * kNormChunksPerThread < chunks) s.group *= 2;
  s.held = static_cast<int>(std::max<int64_t>(1, (chunks + s.group - 1) / s.group));
  return s;
}

// The forward kernels' grid: a block per kThreads / group rows, or with an amax a capped grid
// walking the rows (one atomic per block, not per row: about two resident waves, as the amax
// passes').
inline unsigned norm_rows_grid(int64_t rows, const NormRows& s, const float* amax) {
  const int64_t steps = (rows + kThreads / s.group - 1) / (kThreads / s.group);
  return static_cast<unsigned>(std::min<int64_t>(amax != nullptr ? 2 * kAmaxBlocks : INT32_MAX, steps));
}

// f(std::integral_constant<int, held>{}) for held in [1, Max]: a kernel's instance for s.held.
template <int Max, int H = 1, typename F>
void with_held(int held, const F& f) {
  if constexpr (H <= Max) {
    if (held == H) {
      f(std::integral_constant<int, H>{});
    } else {
      with_held<Max, H + 1>(held, f);
    }
  } else {
    LOOM_CHECK(false, "cuda norm: no kernel holds " + std::to_string(held) + " chunks a thread");
  }
}

// f(V, Held) with both std::integral_constant<int, ...>: the kernel instance a norm launches for
// layout s (chunks of V elements; Held up to Max, or 0).
template <int Max, typename F>
void with_layout(const NormRows& s, const F& f) {
  using Packs = std::integral_constant<int, 4>;
  using Reread = std::integral_constant<int, 0>;
  if (s.held > 0) {
    with_held<Max>(s.held, [&](auto held) { f(Packs{}, held); });
  } else if (s.width == 4) {
    f(Packs{}, Reread{});
  } else {
    f(std::integral_constant<int, 1>{}, Reread{});
  }
}

// This thread's place: its group's size, its index in the group, its group's row among the
// block's `rows` side by side.
struct RowThread {
  int group, lane, row, rows;
};
__device__ inline RowThread row_thread(int group) {
  const int t = static_cast<int>(threadIdx.x);
  return {group, t % group, t / group, kThreads / group};
}

// f(k, c) for this thread's chunks c of a row of `chunks` chunks, in order: k its register slot
// (0..Held-1, known at compile time once unrolled), or 0 when nothing is held (Held = 0).
template <int Held, typename F>
__device__ __forceinline__ void each_chunk(const RowThread& t, int64_t chunks, F f) {
  if constexpr (Held > 0) {
#pragma unroll
    for (int k = 0; k < Held; ++k) {
      const int c = t.lane + k * t.group;  // below kThreads * Held
      if (c < chunks) f(k, c);
    }
  } else {
    for (int64_t c = t.lane; c < chunks; c += t.group) f(0, c);
  }
}

// Chunk c of row x (V elements; fp32, or bf16 widened exactly), read or written.
template <int V, typename T>
__device__ __forceinline__ void load_chunk(const T* x, int64_t c, float (&v)[V]) {
  if constexpr (V == 4) {
    load4(x, c, v);
  } else {
    v[0] = load(x, c);
  }
}
__device__ __forceinline__ void store_chunk(float* x, int64_t c, const float (&v)[4]) {
  reinterpret_cast<Pack4<float>*>(x)[c] = Pack4<float>{{v[0], v[1], v[2], v[3]}};
}
__device__ __forceinline__ void store_chunk(float* x, int64_t c, const float (&v)[1]) { x[c] = v[0]; }
// The same as a norm's output: in one Pack4 where `whole` (the output aligned for it), else element
// by element (the same values); returns the max |value| as stored (amax.cuh's nan_max).
template <int V, typename T>
__device__ __forceinline__ float store_output(T* y, int64_t c, const float (&v)[V], bool whole) {
  if constexpr (V == 4) {
    if (whole) return store4(y, c, v);
  }
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) m = nan_max(m, fabsf(store(y, c * V + j, v[j])));
  return m;
}

// running's nan_max with |v| of a chunk's values (a backward's din, for its amax).
template <int V>
__device__ __forceinline__ float chunk_amax(float running, const float (&v)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) running = nan_max(running, fabsf(v[j]));
  return running;
}

// Sums of K values over each group (every thread gets its group's): a warp's by shuffles, then a
// wider group's warps added in order through `shared` (K * kThreads / 32 floats). Every thread of
// the block calls it: two __syncthreads when a group spans warps.
template <int K>
__device__ inline void group_sums(float (&v)[K], const RowThread& t, float* shared) {
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  if (t.group == 32) return;
  constexpr int kWarps = kThreads / 32;
  const int warps = t.group / 32, warp = static_cast<int>(threadIdx.x) / 32, first = warp - warp % warps;
  __syncthreads();  // a previous call's reads of `shared` are done
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) shared[k * kWarps + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += shared[k * kWarps + first + w];
    v[k] = total;
  }
}
__device__ inline float group_sum(float value, const RowThread& t, float* shared) {
  float v[1] = {value};
  group_sums(v, t, shared);
  return v[0];
}

// A norm forward's passes over this thread's chunks of row xr: f(k, c) with the chunk's values in
// x[k]. Held > 0: the row loaded into x once, by load_row, before the first pass; Held = 0: each
// pass loads its chunk again.
template <int V, int Held>
__device__ __forceinline__ void load_row(const RowThread& t, int64_t chunks, const float* xr,
                                         float (&x)[Held > 0 ? Held : 1][V]) {
  if constexpr (Held > 0) each_chunk<Held>(t, chunks, [&](int k, int64_t c) { load_chunk(xr, c, x[k]); });
}
template <int V, int Held, typename F>
__device__ __forceinline__ void each_row_chunk(const RowThread& t, int64_t chunks, const float* xr,
                                               float (&x)[Held > 0 ? Held : 1][V], F f) {
  each_chunk<Held>(t, chunks, [&](int k, int64_t c) {
    if constexpr (Held == 0) load_chunk(xr, c, x[k]);
    f(k, c);
  });
}

// A forward's input given as a residual add (the add-and-norm forms, kernels::rmsnorm_add_forward_bf16):
// the residual stream's row plus a bf16 product's row, added as a product's finishing pass adds
// (cast.cu's finish kernels: one fp32 rounding) and stored as the stream's next tensor, `sum`,
// which the kernel then reads as its input. residual null: no add, the input read as it is.
struct AddRows {
  const float* residual = nullptr;
  const __nv_bfloat16* add16 = nullptr;
  float* sum = nullptr;
};

// load_row, or with `add` the row's sum written to its place in add.sum (`offset`: the row's first
// element) and, Held > 0, kept in x; with Held = 0 the passes read it back from there (the
// thread's own stores).
template <int V, int Held>
__device__ __forceinline__ void load_or_add_row(const RowThread& t, int64_t chunks, const float* xr, const AddRows& add,
                                                int64_t offset, float (&x)[Held > 0 ? Held : 1][V]) {
  if (add.residual == nullptr) return load_row<V, Held>(t, chunks, xr, x);
  each_chunk<Held>(t, chunks, [&](int k, int64_t c) {
    float a[V], b[V];
    load_chunk(add.residual + offset, c, a);
    load_chunk(add.add16 + offset, c, b);
#pragma unroll
    for (int j = 0; j < V; ++j) x[k][j] = __fadd_rn(a[j], b[j]);
    store_chunk(add.sum + offset, c, x[k]);
  });
}

// A norm backward's row read once where Held > 0: this thread's chunks of x, dy and dx into its
// registers (with Held = 0 each pass reads what it needs again). dy: fp32, or bf16 (Dy).
template <int V, int Held, typename Dy>
__device__ __forceinline__ void load_backward_row(const RowThread& t, int64_t chunks, const float* x, const Dy* dy,
                                                  const float* dx, float (&xv)[Held > 0 ? Held : 1][V],
                                                  float (&dyv)[Held > 0 ? Held : 1][V],
                                                  float (&dxv)[Held > 0 ? Held : 1][V]) {
  if constexpr (Held > 0) {
    each_chunk<Held>(t, chunks, [&](int k, int64_t c) {
      load_chunk(x, c, xv[k]);
      load_chunk(dy, c, dyv[k]);
      load_chunk(dx, c, dxv[k]);
    });
  }
}

// With Held = 0 (nothing held over the row) chunk c of x, dy and the weight, and with kDx (the
// pass that adds into din) of dx too, read where a pass needs them; with Held > 0 nothing: they
// are in the registers load_backward_row and start_block_gradients filled.
template <int V, int Held, bool kDx, typename Dy>
__device__ __forceinline__ void load_unheld_chunk(int64_t c, const float* x, const Dy* dy, const float* weight,
                                                  const float* dx, float (&xv)[V], float (&dyv)[V], float (&w)[V],
                                                  float (&dxv)[V]) {
  if constexpr (Held == 0) {
    load_chunk(x, c, xv);
    load_chunk(dy, c, dyv);
    load_chunk(weight, c, w);
    if constexpr (kDx) load_chunk(dx, c, dxv);
  }
}

// The start of a norm backward's block: with Held > 0 each thread's columns' weights into w;
// with Held = 0 the N column-gradient arrays in shared memory (sums, [N][dim]) zeroed.
template <int V, int Held, int N>
__device__ inline void start_block_gradients(const RowThread& t, int64_t chunks, int64_t dim, const float* weight,
                                             float (&w)[Held > 0 ? Held : 1][V], float* sums) {
  if constexpr (Held > 0) {
    each_chunk<Held>(t, chunks, [&](int k, int64_t c) { load_chunk(weight, c, w[k]); });
  } else {
    for (int64_t i = threadIdx.x; i < N * dim; i += kThreads) sums[i] = 0.0f;
    __syncthreads();
  }
}

// The end of a norm backward's block: with Held > 0 each group's held column gradients (N arrays:
// the weight's, and LayerNorm's bias's) go into sums in group order (with Held = 0 the threads
// added into sums already); then sums become the block's rows of partial ([N][blocks][dim]).
template <int V, int Held, int N>
__device__ inline void write_block_gradients(const RowThread& t, int64_t chunks, int64_t dim,
                                             const float (&held)[N][Held > 0 ? Held : 1][V], float* sums,
                                             float* partial) {
  if constexpr (Held > 0) {
    for (int g = 0; g < t.rows; ++g) {
      if (t.row == g) {
        each_chunk<Held>(t, chunks, [&](int k, int64_t c) {
#pragma unroll
          for (int a = 0; a < N; ++a) {
#pragma unroll
            for (int j = 0; j < V; ++j) {
              float& sum = sums[a * dim + c * V + j];
              sum = g == 0 ? held[a][k][j] : sum + held[a][k][j];
            }
          }
        });
      }
      __syncthreads();
    }
  } else {
    __syncthreads();
  }
  for (int a = 0; a < N; ++a) {
    for (int64_t i = threadIdx.x; i < dim; i += kThreads)
      partial[(a * static_cast<int64_t>(gridDim.x) + blockIdx.x) * dim + i] = sums[a * dim + i];
  }
}

}  // namespace loom::kernels::cuda
