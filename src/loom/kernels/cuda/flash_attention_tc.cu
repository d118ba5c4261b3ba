#include <cmath>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_tokens.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/flash_attention_tc.h"
#include "loom/kernels/cuda/mma.cuh"

namespace loom::kernels::cuda {

namespace {

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

// Positions and documents of rows [row0, row0 + N); rows past len repeat the last one, so they
// leave a block's bounds alone (their scores are masked or never written).
template <int N>
__device__ void stage_tokens(int32_t* pos, int32_t* doc, const Tokens& tokens, int64_t b, int64_t row0) {
  for (int r = threadIdx.x; r < N; r += kBlockThreads) {
    const int64_t row = min(row0 + r, tokens.len - 1);
    pos[r] = tokens.position(b, row);
    doc[r] = tokens.document(b, row);
  }
}

// Bounds of N staged tokens, computed by each warp with shuffles (every lane gets them).
template <int N>
__device__ Range warp_range(const int32_t* pos, const int32_t* doc) {
  Range r{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
  for (int i = threadIdx.x % 32; i < N; i += 32) {
    r.pos_lo = min(r.pos_lo, pos[i]);
    r.pos_hi = max(r.pos_hi, pos[i]);
    r.doc_lo = min(r.doc_lo, doc[i]);
    r.doc_hi = max(r.doc_hi, doc[i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    r.pos_lo = min(r.pos_lo, __shfl_xor_sync(0xffffffffu, r.pos_lo, offset));
    r.pos_hi = max(r.pos_hi, __shfl_xor_sync(0xffffffffu, r.pos_hi, offset));
    r.doc_lo = min(r.doc_lo, __shfl_xor_sync(0xffffffffu, r.doc_lo, offset));
    r.doc_hi = max(r.doc_hi, __shfl_xor_sync(0xffffffffu, r.doc_hi, offset));
  }
  return r;
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

// Forward: one block per 64 queries of one head; each warp owns 16 of them (rows g and g + 8 of
// its fragments) and streams key tiles of 64 with an online softmax in the log2 domain.
template <int D>
__global__ void __launch_bounds__(kBlockThreads) forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                                const bf16* v, FlashAttentionShape s, Tokens qt,
                                                                Tokens kt) {
  constexpr int S = kRowStride<D>, KT = 64;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [64][S]
  bf16* ks = qs + kBlockRows * S;                     // [KT][S]
  bf16* vs = ks + KT * S;                             // [KT][S]
  __shared__ int32_t qpos[kBlockRows], qdoc[kBlockRows], kpos[KT], kdoc[KT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t kvh = h / (s.heads / s.kv_heads);
  stage_rows<D, kBlockRows>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
  mma::copies_commit();
  stage_tokens<kBlockRows>(qpos, qdoc, qt, b, i0);
  mma::copies_wait_all();
  __syncthreads();
  const Range qr = warp_range<kBlockRows>(qpos, qdoc);
  unsigned qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) mma::load_a(qa[kk], qs, S, warp * 16, kk * 16);
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int32_t my_pos[2] = {qpos[row[0]], qpos[row[1]]}, my_doc[2] = {qdoc[row[0]], qdoc[row[1]]};
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float o[D / 8][4] = {};
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  for (int64_t j0 = 0; j0 < s.k_len; j0 += KT) {
    __syncthreads();  // the previous tile's readers are done
    stage_tokens<KT>(kpos, kdoc, kt, b, j0);
    __syncthreads();
    const Range kr = warp_range<KT>(kpos, kdoc);
    if (hidden(qr, kr)) continue;  // the same answer in every thread
    stage_rows<D, KT>(ks, k, b, s.k_len, s.k_stride, kvh * D, j0);
    stage_rows<D, KT>(vs, v, b, s.k_len, s.v_stride, kvh * D, j0);
    mma::copies_commit();
    mma::copies_wait_all();
    __syncthreads();
    const bool masked = !(j0 + KT <= s.k_len && all_visible(qr, kr));
    float sc[KT / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < KT / 16; ++np) {
        unsigned kb[4];
        mma::load_b_nk(kb, ks, S, np * 16, kk * 16);
        mma::multiply_add(sc[2 * np], qa[kk], kb[0], kb[1]);
        mma::multiply_add(sc[2 * np + 1], qa[kk], kb[2], kb[3]);
      }
    }
    float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1), half = e / 2;
        float x = sc[nt][e] * scale_log2;
        if (masked && !(j0 + col < s.k_len && kdoc[col] == my_doc[half] && kpos[col] <= my_pos[half])) x = kNegInf;
        sc[nt][e] = x;
        tile_max[half] = fmaxf(tile_max[half], x);
      }
    }
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_new = fmaxf(m[half], quad_max(tile_max[half]));
      correction[half] = m[half] == kNegInf ? 0.0f : exp2f(m[half] - m_new);
      m[half] = m_new;
      l[half] *= correction[half];
    }
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const float p = sc[nt][e] == kNegInf ? 0.0f : exp2f(sc[nt][e] - m[half]);
        sc[nt][e] = p;
        l[half] += p;
      }
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      o[nt][0] *= correction[0];
      o[nt][1] *= correction[0];
      o[nt][2] *= correction[1];
      o[nt][3] *= correction[1];
    }
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      unsigned pa[4];
      mma::c_to_a(pa, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        unsigned vb[4];
        mma::load_b_kn(vb, vs, S, np * 16, kk * 16);
        mma::multiply_add(o[2 * np], pa, vb[0], vb[1]);
        mma::multiply_add(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float total = quad_sum(l[half]);
    const int64_t i = i0 + row[half];
    if (i >= s.q_len) continue;
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    bf16* out_row = out + (b * s.q_len + i) * s.out_stride + h * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const unsigned pair = mma::pack_bf16(o[nt][2 * half] * inverse, o[nt][2 * half + 1] * inverse);
      *reinterpret_cast<unsigned*>(out_row + nt * 8 + 2 * t) = pair;
    }
    if (t == 0) lse[(b * s.heads + h) * s.q_len + i] = total > 0.0f ? m[half] * kLn2 + logf(total) : kNegInf;
  }
}

// dk and dv of 64 keys of one kv head (16 per warp), over every query head of the group and
// query tiles of QT: S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dV += P^T dO,
// dK += dS^T Q.
template <int D, int QT>
__global__ void __launch_bounds__(kBlockThreads) backward_keys_kernel(float* dk, float* dv, const bf16* dout,
                                                                      const float* lse, const float* delta,
                                                                      const bf16* q, const bf16* k, const bf16* v,
                                                                      FlashAttentionShape s, Tokens qt, Tokens kt) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* ks = reinterpret_cast<bf16*>(shared_bytes);  // [64][S]
  bf16* vs = ks + kBlockRows * S;                     // [64][S]
  bf16* qs = vs + kBlockRows * S;                     // [QT][S]
  bf16* gs = qs + QT * S;                             // [QT][S]: dout
  __shared__ int32_t kpos[kBlockRows], kdoc[kBlockRows], qpos[QT], qdoc[QT];
  __shared__ float lse_s[QT], delta_s[QT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t group = s.heads / s.kv_heads;
  stage_rows<D, kBlockRows>(ks, k, b, s.k_len, s.k_stride, kvh * D, j0);
  stage_rows<D, kBlockRows>(vs, v, b, s.k_len, s.v_stride, kvh * D, j0);
  mma::copies_commit();
  stage_tokens<kBlockRows>(kpos, kdoc, kt, b, j0);
  mma::copies_wait_all();
  __syncthreads();
  const Range kr = warp_range<kBlockRows>(kpos, kdoc);
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int32_t my_pos[2] = {kpos[row[0]], kpos[row[1]]}, my_doc[2] = {kdoc[row[0]], kdoc[row[1]]};
  const bool key_valid[2] = {j0 + row[0] < s.k_len, j0 + row[1] < s.k_len};
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < s.q_len; i0 += QT) {
      __syncthreads();
      stage_tokens<QT>(qpos, qdoc, qt, b, i0);
      for (int r = threadIdx.x; r < QT; r += kBlockThreads) {
        const bool valid = i0 + r < s.q_len;
        const int64_t stat = (b * s.heads + h) * s.q_len + i0 + r;
        lse_s[r] = valid ? lse[stat] : kNegInf;
        delta_s[r] = valid ? delta[stat] : 0.0f;
      }
      __syncthreads();
      const Range qr = warp_range<QT>(qpos, qdoc);
      if (hidden(qr, kr)) continue;
      stage_rows<D, QT>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
      stage_rows<D, QT>(gs, dout, b, s.q_len, s.out_stride, h * D, i0);
      mma::copies_commit();
      mma::copies_wait_all();
      __syncthreads();
      const bool masked = !(j0 + kBlockRows <= s.k_len && all_visible(qr, kr));
      float st[QT / 8][4] = {}, dpt[QT / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        unsigned ka[4], va[4];
        mma::load_a(ka, ks, S, warp * 16, kk * 16);
        mma::load_a(va, vs, S, warp * 16, kk * 16);
#pragma unroll
        for (int np = 0; np < QT / 16; ++np) {
          unsigned fb[4];
          mma::load_b_nk(fb, qs, S, np * 16, kk * 16);
          mma::multiply_add(st[2 * np], ka, fb[0], fb[1]);
          mma::multiply_add(st[2 * np + 1], ka, fb[2], fb[3]);
          mma::load_b_nk(fb, gs, S, np * 16, kk * 16);
          mma::multiply_add(dpt[2 * np], va, fb[0], fb[1]);
          mma::multiply_add(dpt[2 * np + 1], va, fb[2], fb[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + 2 * t + (e & 1), half = e / 2;  // col: query, half: key row
          const float row_lse = lse_s[col];
          bool visible = row_lse != kNegInf;
          if (masked)
            visible = visible && key_valid[half] && qdoc[col] == my_doc[half] && my_pos[half] <= qpos[col];
          const float p = visible ? exp2f(st[nt][e] * scale_log2 - row_lse * kLog2e) : 0.0f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - delta_s[col]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < QT / 16; ++kk) {
        unsigned pa[4], da[4];
        mma::c_to_a(pa, st[2 * kk], st[2 * kk + 1]);
        mma::c_to_a(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          unsigned fb[4];
          mma::load_b_kn(fb, gs, S, np * 16, kk * 16);
          mma::multiply_add(dv_acc[2 * np], pa, fb[0], fb[1]);
          mma::multiply_add(dv_acc[2 * np + 1], pa, fb[2], fb[3]);
          mma::load_b_kn(fb, qs, S, np * 16, kk * 16);
          mma::multiply_add(dk_acc[2 * np], da, fb[0], fb[1]);
          mma::multiply_add(dk_acc[2 * np + 1], da, fb[2], fb[3]);
        }
      }
    }
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!key_valid[half]) continue;
    const int64_t j = j0 + row[half];
    float* dk_row = dk + (b * s.k_len + j) * s.k_stride + kvh * D;
    float* dv_row = dv + (b * s.k_len + j) * s.v_stride + kvh * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      dk_row[col] += scale * dk_acc[nt][2 * half];
      dk_row[col + 1] += scale * dk_acc[nt][2 * half + 1];
      dv_row[col] += dv_acc[nt][2 * half];
      dv_row[col + 1] += dv_acc[nt][2 * half + 1];
    }
  }
}

// dq of 64 queries of one head (16 per warp) over key tiles of KT: S = Q K^T, P, dP = dO V^T,
// dS = P (dP - delta), dQ += dS K.
template <int D, int KT>
__global__ void __launch_bounds__(kBlockThreads) backward_queries_kernel(float* dq, const bf16* dout,
                                                                         const float* lse, const float* delta,
                                                                         const bf16* q, const bf16* k,
                                                                         const bf16* v, FlashAttentionShape s,
                                                                         Tokens qt, Tokens kt) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [64][S]
  bf16* gs = qs + kBlockRows * S;                     // [64][S]: dout
  bf16* ks = gs + kBlockRows * S;                     // [KT][S]
  bf16* vs = ks + KT * S;                             // [KT][S]
  __shared__ int32_t qpos[kBlockRows], qdoc[kBlockRows], kpos[KT], kdoc[KT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t kvh = h / (s.heads / s.kv_heads);
  stage_rows<D, kBlockRows>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
  stage_rows<D, kBlockRows>(gs, dout, b, s.q_len, s.out_stride, h * D, i0);
  mma::copies_commit();
  stage_tokens<kBlockRows>(qpos, qdoc, qt, b, i0);
  mma::copies_wait_all();
  __syncthreads();
  const Range qr = warp_range<kBlockRows>(qpos, qdoc);
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int32_t my_pos[2] = {qpos[row[0]], qpos[row[1]]}, my_doc[2] = {qdoc[row[0]], qdoc[row[1]]};
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool valid = i0 + row[half] < s.q_len;
    const int64_t stat = (b * s.heads + h) * s.q_len + i0 + row[half];
    row_lse[half] = valid ? lse[stat] : kNegInf;
    row_delta[half] = valid ? delta[stat] : 0.0f;
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float dq_acc[D / 8][4] = {};
  for (int64_t j0 = 0; j0 < s.k_len; j0 += KT) {
    __syncthreads();
    stage_tokens<KT>(kpos, kdoc, kt, b, j0);
    __syncthreads();
    const Range kr = warp_range<KT>(kpos, kdoc);
    if (hidden(qr, kr)) continue;
    stage_rows<D, KT>(ks, k, b, s.k_len, s.k_stride, kvh * D, j0);
    stage_rows<D, KT>(vs, v, b, s.k_len, s.v_stride, kvh * D, j0);
    mma::copies_commit();
    mma::copies_wait_all();
    __syncthreads();
    const bool masked = !(j0 + KT <= s.k_len && all_visible(qr, kr));
    float sc[KT / 8][4] = {}, dp[KT / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned qa[4], ga[4];
      mma::load_a(qa, qs, S, warp * 16, kk * 16);
      mma::load_a(ga, gs, S, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < KT / 16; ++np) {
        unsigned fb[4];
        mma::load_b_nk(fb, ks, S, np * 16, kk * 16);
        mma::multiply_add(sc[2 * np], qa, fb[0], fb[1]);
        mma::multiply_add(sc[2 * np + 1], qa, fb[2], fb[3]);
        mma::load_b_nk(fb, vs, S, np * 16, kk * 16);
        mma::multiply_add(dp[2 * np], ga, fb[0], fb[1]);
        mma::multiply_add(dp[2 * np + 1], ga, fb[2], fb[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1), half = e / 2;  // col: key, half: query row
        bool visible = row_lse[half] != kNegInf;
        if (masked) visible = visible && j0 + col < s.k_len && kdoc[col] == my_doc[half] && kpos[col] <= my_pos[half];
        const float p = visible ? exp2f(sc[nt][e] * scale_log2 - row_lse[half] * kLog2e) : 0.0f;
        sc[nt][e] = p * (dp[nt][e] - row_delta[half]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      unsigned da[4];
      mma::c_to_a(da, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        unsigned kb[4];
        mma::load_b_kn(kb, ks, S, np * 16, kk * 16);
        mma::multiply_add(dq_acc[2 * np], da, kb[0], kb[1]);
        mma::multiply_add(dq_acc[2 * np + 1], da, kb[2], kb[3]);
      }
    }
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = i0 + row[half];
    if (i >= s.q_len) continue;
    float* dq_row = dq + (b * s.q_len + i) * s.q_stride + h * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      dq_row[col] += scale * dq_acc[nt][2 * half];
      dq_row[col + 1] += scale * dq_acc[nt][2 * half + 1];
    }
  }
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               std::string("cudaFuncSetAttribute(") + name + ")");
}

unsigned blocks_of(int64_t n) { return static_cast<unsigned>((n + kBlockRows - 1) / kBlockRows); }

template <int D>
void forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const FlashAttentionShape& s,
             const Tokens& qt, const Tokens& kt, cudaStream_t stream) {
  const size_t bytes = sizeof(bf16) * 3 * 64 * kRowStride<D>;
  allow_shared(forward_kernel<D>, bytes, "tensor-core attention forward_kernel");
  const dim3 grid(blocks_of(s.q_len), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  forward_kernel<D><<<grid, kBlockThreads, bytes, stream>>>(out, lse, q, k, v, s, qt, kt);
  check_launch("tensor-core attention forward_kernel");
}

template <int D>
void backward(float* dq, float* dk, float* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
              const bf16* k, const bf16* v, const FlashAttentionShape& s, const Tokens& qt, const Tokens& kt,
              cudaStream_t stream) {
  // Tiles of the streamed side: 64 rows at head_dim 64, 32 at 128 (registers).
  constexpr int streamed = D == 64 ? 64 : 32;
  const size_t bytes = sizeof(bf16) * (2 * 64 + 2 * streamed) * kRowStride<D>;
  allow_shared(backward_keys_kernel<D, streamed>, bytes, "tensor-core attention backward_keys_kernel");
  const dim3 key_grid(blocks_of(s.k_len), static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(s.batch));
  backward_keys_kernel<D, streamed><<<key_grid, kBlockThreads, bytes, stream>>>(dk, dv, dout, lse, delta, q, k, v, s,
                                                                                qt, kt);
  check_launch("tensor-core attention backward_keys_kernel");
  allow_shared(backward_queries_kernel<D, streamed>, bytes, "tensor-core attention backward_queries_kernel");
  const dim3 query_grid(blocks_of(s.q_len), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  backward_queries_kernel<D, streamed><<<query_grid, kBlockThreads, bytes, stream>>>(dq, dout, lse, delta, q, k, v,
                                                                                     s, qt, kt);
  check_launch("tensor-core attention backward_queries_kernel");
}

}  // namespace

bool tensor_core_attention_supports(const FlashAttentionShape& s, std::initializer_list<const void*> tensors) {
  if (s.head_dim != 64 && s.head_dim != 128) return false;
  for (int64_t stride : {s.q_stride, s.k_stride, s.v_stride, s.out_stride})
    if (stride % 8 != 0) return false;
  for (const void* p : tensors)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return s.q_len > 0 && s.k_len > 0;
}

void tensor_core_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis,
                                   cudaStream_t stream) {
  const Tokens qt{vis.q_pos, vis.q_doc, s.q_len}, kt{vis.k_pos, vis.k_doc, s.k_len};
  if (s.head_dim == 64) {
    forward<64>(out, lse, q, k, v, s, qt, kt, stream);
  } else {
    forward<128>(out, lse, q, k, v, s, qt, kt, stream);
  }
}

void tensor_core_attention_backward(float* dq, float* dk, float* dv, const bf16* dout, const float* lse,
                                    const float* delta, const bf16* q, const bf16* k, const bf16* v,
                                    const FlashAttentionShape& s, const AttentionVisibility& vis,
                                    cudaStream_t stream) {
  const Tokens qt{vis.q_pos, vis.q_doc, s.q_len}, kt{vis.k_pos, vis.k_doc, s.k_len};
  if (s.head_dim == 64) {
    backward<64>(dq, dk, dv, dout, lse, delta, q, k, v, s, qt, kt, stream);
  } else {
    backward<128>(dq, dk, dv, dout, lse, delta, q, k, v, s, qt, kt, stream);
  }
}

}  // namespace loom::kernels::cuda
