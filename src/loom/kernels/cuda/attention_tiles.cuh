#pragma once
// The tile steps the tensor-core attention kernels (flash_attention_tc.cu) are made of: staging
// rows into padded shared memory, the bounds of a tile's tokens, the products of warp fragments
// and the softmax pieces. Device code only; every function is inlined into its kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "loom/kernels/cuda/attention_tokens.cuh"
#include "loom/kernels/cuda/mma.cuh"
#include "loom/kernels/types.h"

namespace loom::kernels::cuda::attention_tiles {

using bf16 = __nv_bfloat16;

constexpr int kBlockThreads = 128;  // four warps
constexpr int kBlockRows = 64;      // queries (forward, dq) or keys (dk, dv) per block: 16 per warp
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -INFINITY;

// Shared-memory rows are padded by 16 bytes so the eight rows one ldmatrix reads fall in
// different banks.
template <int D>
constexpr int kRowStride = D + 8;

// Rows [row0, row0 + N) of one head (columns col .. col + D) of a bf16 tensor [batch, len, stride]
// into tile [N][D + 8] by asynchronous copies; rows past len become zeros.
template <int D, int N>
__device__ void stage_rows(bf16* tile, const bf16* base, int64_t b, int64_t len, int64_t stride, int64_t col,
                           int64_t row0) {
  constexpr int chunks = D / 8;
  for (int idx = threadIdx.x; idx < N * chunks; idx += kBlockThreads) {
    const int r = idx / chunks, c = idx % chunks;
    const int64_t row = row0 + r;
    const bool valid = row < len;
    mma::copy16_async(tile + r * kRowStride<D> + c * 8, valid ? base + (b * len + row) * stride + col + c * 8 : base,
                      valid);
  }
}

// Bounds of the positions and documents of rows [row0, row0 + N) (rows past len left out),
// computed by each warp from global memory (every lane gets them; no shared memory, no barrier).
template <int N>
__device__ Range token_range(const Tokens& tokens, int64_t b, int64_t row0) {
  const int64_t last = min(row0 + N, tokens.len) - 1;
  if (tokens.pos == nullptr && tokens.doc == nullptr)
    return Range{static_cast<int32_t>(row0), static_cast<int32_t>(last), 0, 0};
  Range r{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
  for (int i = threadIdx.x % 32; i < N; i += 32) {
    const int64_t row = min(row0 + i, last);
    const int32_t pos = tokens.position(b, row), doc = tokens.document(b, row);
    r.pos_lo = min(r.pos_lo, pos);
    r.pos_hi = max(r.pos_hi, pos);
    r.doc_lo = min(r.doc_lo, doc);
    r.doc_hi = max(r.doc_hi, doc);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    r.pos_lo = min(r.pos_lo, __shfl_xor_sync(0xffffffffu, r.pos_lo, offset));
    r.pos_hi = max(r.pos_hi, __shfl_xor_sync(0xffffffffu, r.pos_hi, offset));
    r.doc_lo = min(r.doc_lo, __shfl_xor_sync(0xffffffffu, r.doc_lo, offset));
    r.doc_hi = max(r.doc_hi, __shfl_xor_sync(0xffffffffu, r.doc_hi, offset));
  }
  return r;
}

// The first tile of N rows of `tokens` at or after `from` that is not hidden from `fixed` (the
// block's own rows; KeysStream: the tiles are keys, else queries), or tokens.len if none is, with
// that tile's bounds in `found`. Every warp computes the same answer.
template <int N, bool KeysStream>
__device__ int64_t next_visible_tile(const Range& fixed, const Tokens& tokens, int64_t b, int64_t from, Range& found) {
  for (; from < tokens.len; from += N) {
    found = token_range<N>(tokens, b, from);
    if (!(KeysStream ? hidden(fixed, found) : hidden(found, fixed))) return from;
  }
  return tokens.len;
}

// The key and value tiles of KT rows the forward and dq kernels stream, double-buffered in shared
// memory ([2][KT][D + 8] each): only tiles some query of the block sees, the next one's copies in
// flight while this one is used.
template <int D, int KT>
struct KeyValueStream {
  bf16* key_tiles;
  bf16* value_tiles;
  const bf16* k;
  const bf16* v;
  int64_t k_stride, v_stride, b, kvh;
  Range queries;  // the block's
  Tokens kt;
  Range next_range;  // bounds of the tile `first` or `advance` returned

  __device__ const bf16* keys(int buffer) const { return key_tiles + buffer * KT * kRowStride<D>; }
  __device__ const bf16* values(int buffer) const { return value_tiles + buffer * KT * kRowStride<D>; }
  __device__ void stage(int buffer, int64_t j0) {
    stage_rows<D, KT>(key_tiles + buffer * KT * kRowStride<D>, k, b, kt.len, k_stride, kvh * D, j0);
    stage_rows<D, KT>(value_tiles + buffer * KT * kRowStride<D>, v, b, kt.len, v_stride, kvh * D, j0);
  }
  // The first visible tile (kt.len: none); its copies into buffer 0 join the caller's next commit.
  __device__ int64_t first() {
    const int64_t j0 = next_visible_tile<KT, true>(queries, kt, b, 0, next_range);
    if (j0 < kt.len) stage(0, j0);
    return j0;
  }
  // Tile j0 in `buffer` is next: starts the copies of the visible tile after it into the other
  // buffer (whose readers passed the barrier that ended the last tile), waits for this one's,
  // and returns where the next one starts. `masked`: some pair of this tile needs the mask.
  __device__ int64_t advance(int buffer, int64_t j0, bool& masked) {
    masked = !(j0 + KT <= kt.len && all_visible(queries, next_range));
    const int64_t next = next_visible_tile<KT, true>(queries, kt, b, j0 + KT, next_range);
    if (next < kt.len) stage(buffer ^ 1, next);
    mma::copies_commit();
    mma::copies_wait_all_but_last();
    __syncthreads();
    return next;
  }
};

// Sum / max over the four lanes that hold one row of a C fragment.
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// x += A B^T for a warp's 16 rows of tile A ([rows][D]) against N rows of tile B ([N][D]): the
// scores S = Q K^T, dP = dO V^T, and their transposes S^T = K Q^T, dP^T = V dO^T.
template <int D, int N>
__device__ __forceinline__ void row_products(float (&x)[N / 8][4], const bf16* a, const bf16* b_tile, int warp) {
  constexpr int S = kRowStride<D>;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned af[4];
    mma::load_a(af, a, S, warp * 16, kk * 16);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned fb[4];
      mma::load_b_nk(fb, b_tile, S, np * 16, kk * 16);
      mma::multiply_add(x[2 * np], af, fb[0], fb[1]);
      mma::multiply_add(x[2 * np + 1], af, fb[2], fb[3]);
    }
  }
}

// A warp's scores of a key tile into probabilities relative to the running row maxima m (log2
// domain; hidden keys get 0), l updated; correction[hf] is what earlier sums must be scaled by.
template <int KT>
__device__ __forceinline__ void online_softmax(float (&sc)[KT / 8][4], float (&m)[2], float (&l)[2],
                                               float (&correction)[2], bool masked, int64_t j0, int64_t k_len,
                                               const Tokens& kt, int64_t b, const int32_t (&my_pos)[2],
                                               const int32_t (&my_doc)[2], float scale_log2) {
  const int t = threadIdx.x % 4;
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e / 2;
      const int64_t j = j0 + nt * 8 + 2 * t + (e & 1);
      float x = sc[nt][e] * scale_log2;
      if (masked && !(j < k_len && kt.document(b, j) == my_doc[hf] && kt.position(b, j) <= my_pos[hf])) x = kNegInf;
      sc[nt][e] = x;
      tile_max[hf] = fmaxf(tile_max[hf], x);
    }
  }
  // Hidden scores are -inf and 2^-inf = 0, so no per-element test: only a row that has seen no
  // key yet (maximum -inf) takes 0 as its reference, to keep -inf - -inf out. A maximum that did
  // not move corrects by exactly 1, so a tile whose keys a row does not see changes none of its
  // sums (paged_prompt_attention.h: a row's result does not depend on its tile-mates).
  float reference[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float m_new = fmaxf(m[hf], quad_max(tile_max[hf]));
    correction[hf] = m[hf] == kNegInf ? 0.0f : m[hf] == m_new ? 1.0f : mma::fast_exp2(m[hf] - m_new);
    m[hf] = m_new;
    l[hf] *= correction[hf];
    reference[hf] = m_new == kNegInf ? 0.0f : m_new;
  }
#pragma unroll
  for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = mma::fast_exp2(sc[nt][e] - reference[e / 2]);
      sc[nt][e] = p;
      l[e / 2] += p;
    }
  }
}

// O rows scaled by the softmax's correction (the running maxima moved).
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], const float (&correction)[2]) {
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    o[nt][0] *= correction[0];
    o[nt][1] *= correction[0];
    o[nt][2] *= correction[1];
    o[nt][3] *= correction[1];
  }
}

// The rows first_row and first_row + 8 of a warp's fragments: out = O / l in bf16, lse = ln(sum e^s).
template <int D>
__device__ __forceinline__ void write_rows(bf16* out, float* lse, const float (&o)[D / 8][4], const float (&m)[2],
                                           const float (&l)[2], const FlashAttentionShape& s, int64_t b, int64_t h,
                                           int64_t first_row) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float total = quad_sum(l[hf]);
    const int64_t i = first_row + 8 * hf;
    if (i >= s.q_len) continue;
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    bf16* out_row = out + (b * s.q_len + i) * s.out_stride + h * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const unsigned pair = mma::pack_bf16(o[nt][2 * hf] * inverse, o[nt][2 * hf + 1] * inverse);
      *reinterpret_cast<unsigned*>(out_row + nt * 8 + 2 * t) = pair;
    }
    if (t == 0) lse[(b * s.heads + h) * s.q_len + i] = total > 0.0f ? m[hf] * kLn2 + logf(total) : kNegInf;
  }
}

// acc += P B for a warp's fp32 fragments P (16 x N, rounded to bf16) and a tile B stored [N][D]
// (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K).
template <int D, int N>
__device__ __forceinline__ void accumulate_products(float (&acc)[D / 8][4], const float (&p)[N / 8][4],
                                                    const bf16* b_tile) {
  constexpr int S = kRowStride<D>;
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    unsigned pa[4];
    mma::c_to_a(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      unsigned fb[4];
      mma::load_b_kn(fb, b_tile, S, np * 16, kk * 16);
      mma::multiply_add(acc[2 * np], pa, fb[0], fb[1]);
      mma::multiply_add(acc[2 * np + 1], pa, fb[2], fb[3]);
    }
  }
}

// row[...] += scale * this thread's columns of one half (rows g or g + 8) of a fragment row block.
template <int D>
__device__ __forceinline__ void add_row(float* row, const float (&acc)[D / 8][4], int half, float scale) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    row[nt * 8 + 2 * t] += scale * acc[nt][2 * half];
    row[nt * 8 + 2 * t + 1] += scale * acc[nt][2 * half + 1];
  }
}

// S^T and dP^T of a warp's 16 keys (rows) against a query tile (columns) into P^T and
// dS^T = P^T (dP^T - delta) in place; hidden pairs and rows of -inf lse get 0. lse_tile holds
// each query's lse in the log2 domain (times log2 e).
template <int QT>
__device__ __forceinline__ void transposed_probabilities(float (&st)[QT / 8][4], float (&dpt)[QT / 8][4],
                                                         const float* lse_tile, const float* delta_tile, bool masked,
                                                         int64_t i0, int64_t q_len, const Tokens& qt, int64_t b,
                                                         const bool (&key_valid)[2], const int32_t (&my_pos)[2],
                                                         const int32_t (&my_doc)[2], float scale_log2) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + 2 * t + (e & 1), half = e / 2;  // col: query, half: key row
      const float row_lse = lse_tile[col];
      bool visible = row_lse != kNegInf;
      if (masked) {
        const int64_t i = min(i0 + col, q_len - 1);
        visible = visible && key_valid[half] && qt.document(b, i) == my_doc[half] && my_pos[half] <= qt.position(b, i);
      }
      const float p = visible ? mma::fast_exp2(st[nt][e] * scale_log2 - row_lse) : 0.0f;
      st[nt][e] = p;
      dpt[nt][e] = p * (dpt[nt][e] - delta_tile[col]);
    }
  }
}

}  // namespace loom::kernels::cuda::attention_tiles
