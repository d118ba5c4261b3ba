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
// block's own rows; KeysStream: the tiles are keys, else queries), or tokens.len if none is. Every
// warp computes the same answer.
template <int N, bool KeysStream>
__device__ int64_t next_visible_tile(const Range& fixed, const Tokens& tokens, int64_t b, int64_t from) {
  for (; from < tokens.len; from += N) {
    const Range tile = token_range<N>(tokens, b, from);
    if (!(KeysStream ? hidden(fixed, tile) : hidden(tile, fixed))) return from;
  }
  return tokens.len;
}

// Sum / max over the four lanes that hold one row of a C fragment.
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// S = Q K^T for a warp's MT m-tiles against a key tile (fp32 accumulators).
template <int D, int MT, int KT>
__device__ __forceinline__ void tile_scores(float (&sc)[MT][KT / 8][4], const bf16* qs, const bf16* ktile, int warp) {
  constexpr int S = kRowStride<D>;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma::load_a(qa[mt], qs, S, warp * 16 * MT + 16 * mt, kk * 16);
#pragma unroll
    for (int np = 0; np < KT / 16; ++np) {
      unsigned kb[4];
      mma::load_b_nk(kb, ktile, S, np * 16, kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma::multiply_add(sc[mt][2 * np], qa[mt], kb[0], kb[1]);
        mma::multiply_add(sc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
      }
    }
  }
}

// One m-tile's scores of a key tile into probabilities relative to the running row maxima m (log2
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
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float m_new = fmaxf(m[hf], quad_max(tile_max[hf]));
    correction[hf] = m[hf] == kNegInf ? 0.0f : exp2f(m[hf] - m_new);
    m[hf] = m_new;
    l[hf] *= correction[hf];
  }
#pragma unroll
  for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e / 2;
      const float p = sc[nt][e] == kNegInf ? 0.0f : exp2f(sc[nt][e] - m[hf]);
      sc[nt][e] = p;
      l[hf] += p;
    }
  }
}

// O += P V for a warp's MT m-tiles (P rounded to bf16).
template <int D, int MT, int KT>
__device__ __forceinline__ void accumulate_values(float (&o)[MT][D / 8][4], const float (&sc)[MT][KT / 8][4],
                                                  const bf16* vtile) {
  constexpr int S = kRowStride<D>;
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) {
    unsigned pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma::c_to_a(pa[mt], sc[mt][2 * kk], sc[mt][2 * kk + 1]);
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      unsigned vb[4];
      mma::load_b_kn(vb, vtile, S, np * 16, kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma::multiply_add(o[mt][2 * np], pa[mt], vb[0], vb[1]);
        mma::multiply_add(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
      }
    }
  }
}

// The rows first_row and first_row + 8 of one m-tile: out = O / l in bf16, lse = ln(sum e^s).
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

// Two products of a warp's 16 rows of `a` and of `c` against the same n-tile stream: x = A B^T and
// y = C D^T, with B and D stored [n][k] (the backward's S = Q K^T beside dP = dO V^T, or S^T = K Q^T
// beside dP^T = V dO^T).
template <int D, int N>
__device__ __forceinline__ void paired_products(float (&x)[N / 8][4], float (&y)[N / 8][4], const bf16* a,
                                                const bf16* c, const bf16* b_tile, const bf16* d_tile, int warp) {
  constexpr int S = kRowStride<D>;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned af[4], cf[4];
    mma::load_a(af, a, S, warp * 16, kk * 16);
    mma::load_a(cf, c, S, warp * 16, kk * 16);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned fb[4];
      mma::load_b_nk(fb, b_tile, S, np * 16, kk * 16);
      mma::multiply_add(x[2 * np], af, fb[0], fb[1]);
      mma::multiply_add(x[2 * np + 1], af, fb[2], fb[3]);
      mma::load_b_nk(fb, d_tile, S, np * 16, kk * 16);
      mma::multiply_add(y[2 * np], cf, fb[0], fb[1]);
      mma::multiply_add(y[2 * np + 1], cf, fb[2], fb[3]);
    }
  }
}

// acc += P B for a warp's fp32 fragments P (16 x N, rounded to bf16) and a tile B stored [N][D]
// (dV += P^T dO, dK += dS^T Q, dQ += dS K).
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
// dS^T = P^T (dP^T - delta) in place; hidden pairs and rows of -inf lse get 0.
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
      const float p = visible ? exp2f(st[nt][e] * scale_log2 - row_lse * kLog2e) : 0.0f;
      st[nt][e] = p;
      dpt[nt][e] = p * (dpt[nt][e] - delta_tile[col]);
    }
  }
}

}  // namespace loom::kernels::cuda::attention_tiles
