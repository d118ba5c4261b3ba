#include <cmath>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_tiles.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/flash_attention_tc.h"
#include "loom/kernels/cuda/mma.cuh"
#include "loom/kernels/cuda/shared_memory.cuh"

namespace loom::kernels::cuda {

namespace {

using namespace attention_tiles;

// Forward: one block per 64 queries of one head; each warp owns 16 of them (rows g and g + 8 of
// its fragments) and streams the visible key tiles with an online softmax in the log2 domain.
// At head_dim 64 shared memory leaves room for 4 blocks per SM: registers are capped to match.
template <int D, int KT>
__global__ void __launch_bounds__(kBlockThreads, D == 64 ? 4 : 2) forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                                const bf16* v, FlashAttentionShape s, Tokens qt,
                                                                Tokens kt) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [64][S], then the key and value tiles
  const int warp = threadIdx.x / 32, row = warp * 16 + (threadIdx.x % 32) / 4;
  // Later query blocks see more keys under a causal mask: they start first, so the last wave is
  // made of short blocks (the grid's tail).
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const int64_t kvh = h / (s.heads / s.kv_heads);
  KeyValueStream<D, KT> keys{qs + kBlockRows * S, qs + (kBlockRows + 2 * KT) * S, k, v, s.k_stride, s.v_stride,
                             b, kvh, token_range<kBlockRows>(qt, b, i0), kt, {}};
  stage_rows<D, kBlockRows>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
  int64_t j0 = keys.first();
  mma::copies_commit();
  mma::copies_wait_all();
  __syncthreads();
  int32_t my_pos[2], my_doc[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = min(i0 + row + 8 * hf, s.q_len - 1);
    my_pos[hf] = qt.position(b, i);
    my_doc[hf] = qt.document(b, i);
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float o[D / 8][4] = {};
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  for (int buffer = 0; j0 < s.k_len; buffer ^= 1) {
    bool masked;
    const int64_t next = keys.advance(buffer, j0, masked);
    float sc[KT / 8][4] = {}, correction[2];
    row_products<D, KT>(sc, qs, keys.keys(buffer), warp);
    online_softmax<KT>(sc, m, l, correction, masked, j0, s.k_len, kt, b, my_pos, my_doc, scale_log2);
    rescale_rows<D>(o, correction);
    accumulate_products<D, KT>(o, sc, keys.values(buffer));
    __syncthreads();  // this buffer's readers are done before the next tile's copies refill it
    j0 = next;
  }
  write_rows<D>(out, lse, o, m, l, s, b, h, i0 + row);
}

// The first position at or after u of the dk/dv kernel's stream (group heads x tiles query tiles
// of QT) whose query tile some key of the block sees, or group * tiles, with the tile's bounds in
// `found`. Visibility does not depend on the head.
template <int QT>
__device__ int64_t next_visible_stream_tile(const Range& keys, const Tokens& qt, int64_t b, int64_t u, int64_t group,
                                            int64_t tiles, Range& found) {
  while (u < group * tiles) {
    const int64_t i0 = next_visible_tile<QT, false>(keys, qt, b, (u % tiles) * QT, found);
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
  const int warp = threadIdx.x / 32, row = warp * 16 + (threadIdx.x % 32) / 4;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t group = s.heads / s.kv_heads, tiles = (s.q_len + QT - 1) / QT;
  const Range kr = token_range<kBlockRows>(kt, b, j0);
  // Stream position u: query head kvh * group + u / tiles, query tile (u % tiles) * QT. Whether a
  // tile is visible does not depend on the head.
  Range next_range;  // bounds of the query tile next_visible returned last
  auto next_visible = [&](int64_t u) {
    return next_visible_stream_tile<QT>(kr, qt, b, u, group, tiles, next_range);
  };
  auto stage = [&](int64_t u, int buffer) {
    const int64_t h = kvh * group + u / tiles, i0 = (u % tiles) * QT;
    stage_rows<D, QT>(qs + buffer * QT * S, q, b, s.q_len, s.q_stride, h * D, i0);
    stage_rows<D, QT>(gs + buffer * QT * S, dout, b, s.q_len, s.out_stride, h * D, i0);
    for (int r = threadIdx.x; r < QT; r += kBlockThreads) {
      const bool valid = i0 + r < s.q_len;
      const int64_t stat = (b * s.heads + h) * s.q_len + i0 + r;
      lse_s[buffer][r] = valid ? lse[stat] * kLog2e : kNegInf;  // log2 domain
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
  int32_t my_pos[2], my_doc[2];
  bool key_valid[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t j = min(j0 + row + 8 * half, s.k_len - 1);
    my_pos[half] = kt.position(b, j);
    my_doc[half] = kt.document(b, j);
    key_valid[half] = j0 + row + 8 * half < s.k_len;
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int buffer = 0; u < group * tiles; buffer ^= 1) {
    const int64_t i0 = (u % tiles) * QT;
    const bool masked = !(j0 + kBlockRows <= s.k_len && i0 + QT <= s.q_len && all_visible(next_range, kr));
    const int64_t next = next_visible(u + 1);
    if (next < group * tiles) stage(next, buffer ^ 1);
    mma::copies_commit();
    mma::copies_wait_all_but_last();
    __syncthreads();
    const bf16* qtile = qs + buffer * QT * S;
    const bf16* gtile = gs + buffer * QT * S;
    float st[QT / 8][4] = {}, dpt[QT / 8][4] = {};
    row_products<D, QT>(st, ks, qtile, warp);
    row_products<D, QT>(dpt, vs, gtile, warp);
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
    const int64_t j = j0 + row + 8 * half;
    add_row<D>(dk + (b * s.k_len + j) * s.k_stride + kvh * D, dk_acc, half, scale);
    add_row<D>(dv + (b * s.k_len + j) * s.v_stride + kvh * D, dv_acc, half, 1.0f);
  }
}

// dq of 64 queries of one head (16 per warp) over the visible key tiles: S = Q K^T, P,
// dP = dO V^T, dS = P (dP - delta), dQ += dS K.
template <int D, int KT>
__global__ void __launch_bounds__(kBlockThreads) backward_queries_kernel(float* dq, const bf16* dout,
                                                                         const float* lse, const float* delta,
                                                                         const bf16* q, const bf16* k,
                                                                         const bf16* v, FlashAttentionShape s,
                                                                         Tokens qt, Tokens kt) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [64][S]
  bf16* gs = qs + kBlockRows * S;                     // [64][S]: dout, then the key and value tiles
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, t = lane % 4, row = warp * 16 + lane / 4;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;  // heaviest first
  const int64_t kvh = h / (s.heads / s.kv_heads);
  KeyValueStream<D, KT> keys{gs + kBlockRows * S, gs + (kBlockRows + 2 * KT) * S, k, v, s.k_stride, s.v_stride,
                             b, kvh, token_range<kBlockRows>(qt, b, i0), kt, {}};
  stage_rows<D, kBlockRows>(qs, q, b, s.q_len, s.q_stride, h * D, i0);
  stage_rows<D, kBlockRows>(gs, dout, b, s.q_len, s.out_stride, h * D, i0);
  int64_t j0 = keys.first();
  mma::copies_commit();
  mma::copies_wait_all();
  __syncthreads();
  int32_t my_pos[2], my_doc[2];
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool valid = i0 + row + 8 * half < s.q_len;
    const int64_t i = min(i0 + row + 8 * half, s.q_len - 1), stat = (b * s.heads + h) * s.q_len + i;
    my_pos[half] = qt.position(b, i);
    my_doc[half] = qt.document(b, i);
    row_lse[half] = valid ? lse[stat] * kLog2e : kNegInf;  // log2 domain
    row_delta[half] = valid ? delta[stat] : 0.0f;
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float dq_acc[D / 8][4] = {};
  for (int buffer = 0; j0 < s.k_len; buffer ^= 1) {
    bool masked;
    const int64_t next = keys.advance(buffer, j0, masked);
    float sc[KT / 8][4] = {}, dp[KT / 8][4] = {};
    row_products<D, KT>(sc, qs, keys.keys(buffer), warp);
    row_products<D, KT>(dp, gs, keys.values(buffer), warp);
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;  // query row; the column is a key
        const int64_t j = j0 + nt * 8 + 2 * t + (e & 1);
        bool visible = row_lse[half] != kNegInf;
        if (masked)
          visible = visible && j < s.k_len && kt.document(b, j) == my_doc[half] && kt.position(b, j) <= my_pos[half];
        const float p = visible ? mma::fast_exp2(sc[nt][e] * scale_log2 - row_lse[half]) : 0.0f;
        sc[nt][e] = p * (dp[nt][e] - row_delta[half]);
      }
    }
    accumulate_products<D, KT>(dq_acc, sc, keys.keys(buffer));
    __syncthreads();
    j0 = next;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = i0 + row + 8 * half;
    if (i < s.q_len) add_row<D>(dq + (b * s.q_len + i) * s.q_stride + h * D, dq_acc, half, scale);
  }
}

unsigned blocks_of(int64_t n) { return static_cast<unsigned>((n + kBlockRows - 1) / kBlockRows); }

// Key tiles of 64. Two m-tiles per warp (fewer shared-memory reads per product) were measured
// slower at head_dim 64 (255 registers: half the resident warps) and spill at 128.
template <int D>
void forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const FlashAttentionShape& s,
             const Tokens& qt, const Tokens& kt, cudaStream_t stream) {
  constexpr int KT = 64;
  const size_t bytes = sizeof(bf16) * (kBlockRows + 2 * 2 * KT) * kRowStride<D>;  // q, two k and v buffers
  allow_shared(forward_kernel<D, KT>, bytes, "tensor-core attention forward_kernel");
  const dim3 grid(blocks_of(s.q_len), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  forward_kernel<D, KT><<<grid, kBlockThreads, bytes, stream>>>(out, lse, q, k, v, s, qt, kt);
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
