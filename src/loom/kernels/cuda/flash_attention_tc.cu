#include <cmath>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_tiles.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/flash_attention_tc.h"
#include "loom/kernels/cuda/mma.cuh"

namespace loom::kernels::cuda {

namespace {

using namespace attention_tiles;

// Forward: one block per 64 MT queries of one head; each warp owns 16 MT of them (MT m-tiles;
// rows g and g + 8 of each) and streams key tiles of KT with an online softmax in the log2
// domain. Two m-tiles per warp let every K and V fragment read from shared memory feed twice the
// products. Key tiles are double-buffered: the next visible tile's copies are in flight while
// this one is computed.
template <int D, int MT, int KT>
__global__ void __launch_bounds__(kBlockThreads) forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                                const bf16* v, FlashAttentionShape s, Tokens qt,
                                                                Tokens kt) {
  constexpr int S = kRowStride<D>, BR = 64 * MT;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [BR][S]
  bf16* ks = qs + BR * S;                             // [2][KT][S]
  bf16* vs = ks + 2 * KT * S;                         // [2][KT][S]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  // Later query blocks see more keys under a causal mask: they start first, so the last wave is
  // made of short blocks (the grid's tail).
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;
  const int64_t kvh = h / (s.heads / s.kv_heads);
  const Range qr = token_range<BR>(qt, b, i0);
  int64_t j0 = next_visible_tile<KT, true>(qr, kt, b, 0);
  stage_rows<D, BR>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
  if (j0 < s.k_len) {
    stage_rows<D, KT>(ks, k, b, s.k_len, s.k_stride, kvh * D, j0);
    stage_rows<D, KT>(vs, v, b, s.k_len, s.v_stride, kvh * D, j0);
  }
  mma::copies_commit();
  mma::copies_wait_all();
  __syncthreads();
  // Row r of m-tile mt, half hf: warp * 16 MT + 16 mt + g + 8 hf.
  int32_t my_pos[MT][2], my_doc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t i = min(i0 + warp * 16 * MT + 16 * mt + g + 8 * hf, s.q_len - 1);
      my_pos[mt][hf] = qt.position(b, i);
      my_doc[mt][hf] = qt.document(b, i);
    }
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float o[MT][D / 8][4] = {};
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = kNegInf, l[mt][0] = l[mt][1] = 0.0f;
  for (int buffer = 0; j0 < s.k_len; buffer ^= 1) {
    const int64_t next = next_visible_tile<KT, true>(qr, kt, b, j0 + KT);
    if (next < s.k_len) {  // the other buffer's readers passed the barrier that ended the last tile
      stage_rows<D, KT>(ks + (buffer ^ 1) * KT * S, k, b, s.k_len, s.k_stride, kvh * D, next);
      stage_rows<D, KT>(vs + (buffer ^ 1) * KT * S, v, b, s.k_len, s.v_stride, kvh * D, next);
    }
    mma::copies_commit();
    mma::copies_wait_all_but_last();
    __syncthreads();
    const bf16* ktile = ks + buffer * KT * S;
    const bf16* vtile = vs + buffer * KT * S;
    const bool masked = !(j0 + KT <= s.k_len && all_visible(qr, token_range<KT>(kt, b, j0)));
    float sc[MT][KT / 8][4] = {};
    tile_scores<D, MT, KT>(sc, qs, ktile, warp);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float correction[2];
      online_softmax<KT>(sc[mt], m[mt], l[mt], correction, masked, j0, s.k_len, kt, b, my_pos[mt], my_doc[mt],
                         scale_log2);
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        o[mt][nt][0] *= correction[0];
        o[mt][nt][1] *= correction[0];
        o[mt][nt][2] *= correction[1];
        o[mt][nt][3] *= correction[1];
      }
    }
    accumulate_values<D, MT, KT>(o, sc, vtile);
    __syncthreads();  // this buffer's readers are done before the next tile's copies refill it
    j0 = next;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    write_rows<D>(out, lse, o[mt], m[mt], l[mt], s, b, h, i0 + warp * 16 * MT + 16 * mt + g);
}

// The first position at or after u of the dk/dv kernel's stream (group heads x tiles query tiles
// of QT) whose query tile some key of the block sees, or group * tiles. Visibility does not
// depend on the head.
template <int QT>
__device__ int64_t next_visible_stream_tile(const Range& keys, const Tokens& qt, int64_t b, int64_t u, int64_t group,
                                            int64_t tiles) {
  while (u < group * tiles) {
    const int64_t i0 = next_visible_tile<QT, false>(keys, qt, b, (u % tiles) * QT);
    if (i0 < qt.len) return u - u % tiles + i0 / QT;
    u += tiles - u % tiles;  // no visible tile left for this head
  }
  return group * tiles;
}

// dk and dv of 64 keys of one kv head (16 per warp), over every query head of the group and
// query tiles of QT (one stream of group x tiles, double-buffered like the forward's keys):
// S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dV += P^T dO, dK += dS^T Q.
template <int D, int QT>
__global__ void __launch_bounds__(kBlockThreads) backward_keys_kernel(float* dk, float* dv, const bf16* dout,
                                                                      const float* lse, const float* delta,
                                                                      const bf16* q, const bf16* k, const bf16* v,
                                                                      FlashAttentionShape s, Tokens qt, Tokens kt) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* ks = reinterpret_cast<bf16*>(shared_bytes);  // [64][S]
  bf16* vs = ks + kBlockRows * S;                     // [64][S]
  bf16* qs = vs + kBlockRows * S;                     // [2][QT][S]
  bf16* gs = qs + 2 * QT * S;                         // [2][QT][S]: dout
  __shared__ float lse_s[2][QT], delta_s[2][QT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t group = s.heads / s.kv_heads, tiles = (s.q_len + QT - 1) / QT;
  const Range kr = token_range<kBlockRows>(kt, b, j0);
  // Stream position u: query head kvh * group + u / tiles, query tile (u % tiles) * QT. Whether a
  // tile is visible does not depend on the head.
  auto next_visible = [&](int64_t u) { return next_visible_stream_tile<QT>(kr, qt, b, u, group, tiles); };
  auto stage = [&](int64_t u, int buffer) {
    const int64_t h = kvh * group + u / tiles, i0 = (u % tiles) * QT;
    stage_rows<D, QT>(qs + buffer * QT * S, q, b, s.q_len, s.q_stride, h * D, i0);
    stage_rows<D, QT>(gs + buffer * QT * S, dout, b, s.q_len, s.out_stride, h * D, i0);
    for (int r = threadIdx.x; r < QT; r += kBlockThreads) {
      const bool valid = i0 + r < s.q_len;
      const int64_t stat = (b * s.heads + h) * s.q_len + i0 + r;
      lse_s[buffer][r] = valid ? lse[stat] : kNegInf;
      delta_s[buffer][r] = valid ? delta[stat] : 0.0f;
    }
  };
  int64_t u = next_visible(0);
  stage_rows<D, kBlockRows>(ks, k, b, s.k_len, s.k_stride, kvh * D, j0);
  stage_rows<D, kBlockRows>(vs, v, b, s.k_len, s.v_stride, kvh * D, j0);
  if (u < group * tiles) stage(u, 0);
  mma::copies_commit();
  mma::copies_wait_all();
  __syncthreads();
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  int32_t my_pos[2], my_doc[2];
  bool key_valid[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t j = min(j0 + row[half], s.k_len - 1);
    my_pos[half] = kt.position(b, j);
    my_doc[half] = kt.document(b, j);
    key_valid[half] = j0 + row[half] < s.k_len;
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int buffer = 0; u < group * tiles; buffer ^= 1) {
    const int64_t next = next_visible(u + 1);
    if (next < group * tiles) stage(next, buffer ^ 1);
    mma::copies_commit();
    mma::copies_wait_all_but_last();
    __syncthreads();
    const int64_t i0 = (u % tiles) * QT;
    const bf16* qtile = qs + buffer * QT * S;
    const bf16* gtile = gs + buffer * QT * S;
    const bool masked =
        !(j0 + kBlockRows <= s.k_len && i0 + QT <= s.q_len && all_visible(token_range<QT>(qt, b, i0), kr));
    float st[QT / 8][4] = {}, dpt[QT / 8][4] = {};
    paired_products<D, QT>(st, dpt, ks, vs, qtile, gtile, warp);
    transposed_probabilities<QT>(st, dpt, lse_s[buffer], delta_s[buffer], masked, i0, s.q_len, qt, b, key_valid,
                                 my_pos, my_doc, scale_log2);
    accumulate_products<D, QT>(dv_acc, st, gtile);
    accumulate_products<D, QT>(dk_acc, dpt, qtile);
    __syncthreads();
    u = next;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!key_valid[half]) continue;
    const int64_t j = j0 + row[half];
    add_row<D>(dk + (b * s.k_len + j) * s.k_stride + kvh * D, dk_acc, half, scale);
    add_row<D>(dv + (b * s.k_len + j) * s.v_stride + kvh * D, dv_acc, half, 1.0f);
  }
}

// dq of 64 queries of one head (16 per warp) over key tiles of KT (double-buffered): S = Q K^T,
// P, dP = dO V^T, dS = P (dP - delta), dQ += dS K.
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
  bf16* ks = gs + kBlockRows * S;                     // [2][KT][S]
  bf16* vs = ks + 2 * KT * S;                         // [2][KT][S]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;  // heaviest first
  const int64_t kvh = h / (s.heads / s.kv_heads);
  const Range qr = token_range<kBlockRows>(qt, b, i0);
  int64_t j0 = next_visible_tile<KT, true>(qr, kt, b, 0);
  stage_rows<D, kBlockRows>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
  stage_rows<D, kBlockRows>(gs, dout, b, s.q_len, s.out_stride, h * D, i0);
  if (j0 < s.k_len) {
    stage_rows<D, KT>(ks, k, b, s.k_len, s.k_stride, kvh * D, j0);
    stage_rows<D, KT>(vs, v, b, s.k_len, s.v_stride, kvh * D, j0);
  }
  mma::copies_commit();
  mma::copies_wait_all();
  __syncthreads();
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  int32_t my_pos[2], my_doc[2];
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool valid = i0 + row[half] < s.q_len;
    const int64_t i = min(i0 + row[half], s.q_len - 1), stat = (b * s.heads + h) * s.q_len + i;
    my_pos[half] = qt.position(b, i);
    my_doc[half] = qt.document(b, i);
    row_lse[half] = valid ? lse[stat] : kNegInf;
    row_delta[half] = valid ? delta[stat] : 0.0f;
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float dq_acc[D / 8][4] = {};
  for (int buffer = 0; j0 < s.k_len; buffer ^= 1) {
    const int64_t next = next_visible_tile<KT, true>(qr, kt, b, j0 + KT);
    if (next < s.k_len) {
      stage_rows<D, KT>(ks + (buffer ^ 1) * KT * S, k, b, s.k_len, s.k_stride, kvh * D, next);
      stage_rows<D, KT>(vs + (buffer ^ 1) * KT * S, v, b, s.k_len, s.v_stride, kvh * D, next);
    }
    mma::copies_commit();
    mma::copies_wait_all_but_last();
    __syncthreads();
    const bf16* ktile = ks + buffer * KT * S;
    const bf16* vtile = vs + buffer * KT * S;
    const bool masked = !(j0 + KT <= s.k_len && all_visible(qr, token_range<KT>(kt, b, j0)));
    float sc[KT / 8][4] = {}, dp[KT / 8][4] = {};
    paired_products<D, KT>(sc, dp, qs, gs, ktile, vtile, warp);
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;  // query row; the column is a key
        const int64_t j = j0 + nt * 8 + 2 * t + (e & 1);
        bool visible = row_lse[half] != kNegInf;
        if (masked)
          visible = visible && j < s.k_len && kt.document(b, j) == my_doc[half] && kt.position(b, j) <= my_pos[half];
        const float p = visible ? exp2f(sc[nt][e] * scale_log2 - row_lse[half] * kLog2e) : 0.0f;
        sc[nt][e] = p * (dp[nt][e] - row_delta[half]);
      }
    }
    accumulate_products<D, KT>(dq_acc, sc, ktile);
    __syncthreads();
    j0 = next;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = i0 + row[half];
    if (i < s.q_len) add_row<D>(dq + (b * s.q_len + i) * s.q_stride + h * D, dq_acc, half, scale);
  }
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               std::string("cudaFuncSetAttribute(") + name + ")");
}

unsigned blocks_of(int64_t n) { return static_cast<unsigned>((n + kBlockRows - 1) / kBlockRows); }

// One m-tile per warp, key tiles of 64. Two m-tiles (fewer shared-memory reads per product) were
// measured slower at head_dim 64 (255 registers: half the resident warps) and spill at 128.
template <int D>
void forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const FlashAttentionShape& s,
             const Tokens& qt, const Tokens& kt, cudaStream_t stream) {
  constexpr int MT = 1, KT = 64;
  const size_t bytes = sizeof(bf16) * (64 * MT + 2 * 2 * KT) * kRowStride<D>;  // q, two k and v buffers
  allow_shared(forward_kernel<D, MT, KT>, bytes, "tensor-core attention forward_kernel");
  const dim3 grid(static_cast<unsigned>((s.q_len + 64 * MT - 1) / (64 * MT)), static_cast<unsigned>(s.heads),
                  static_cast<unsigned>(s.batch));
  forward_kernel<D, MT, KT><<<grid, kBlockThreads, bytes, stream>>>(out, lse, q, k, v, s, qt, kt);
  check_launch("tensor-core attention forward_kernel");
}

template <int D>
void backward(float* dq, float* dk, float* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
              const bf16* k, const bf16* v, const FlashAttentionShape& s, const Tokens& qt, const Tokens& kt,
              cudaStream_t stream) {
  // Tiles of the streamed side: 64 rows at head_dim 64, 32 at 128 (registers).
  constexpr int streamed = D == 64 ? 64 : 32;
  const size_t bytes = sizeof(bf16) * (2 * 64 + 2 * 2 * streamed) * kRowStride<D>;  // fixed pair, two streamed
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
