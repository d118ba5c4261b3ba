#pragma once
// The materialising causal attention (every probability kept, memory quadratic in the sequence),
// kept as the reference of tests and benchmarks; training uses flash_attention.h. And KV-cache
// decoding. Grouped-query heads over a fused qkv activation.
// Layout: qkv[b, t, :] = [q (heads*head_dim) | k (kv_heads*head_dim) | v (kv_heads*head_dim)],
// out[b, t, :] = heads*head_dim. Query head h reads kv head h / (heads / kv_heads).
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

using kernels::AttentionShape;

// probs[b, h, t, t'] (t' <= t) saved for backward; entries above the diagonal are left zero.
void reference_attention_forward(float* out, float* probs, const float* qkv, const AttentionShape& s);

// Adds into dqkv (same layout as qkv) from dout and the saved probs.
void reference_attention_backward(float* dqkv, const float* dout, const float* probs, const float* qkv,
                                  const AttentionShape& s);

// Decoding with a KV cache: `q` holds `new_tokens` query rows for one sequence at positions
// [past, past + new_tokens); the caches hold keys/values [position, kv_heads*head_dim] for
// positions [0, past + new_tokens). out: [new_tokens, heads*head_dim]. The paged kernel
// (paged_attention.h) over one block holding the whole cache.
void attention_decode(float* out, const float* q, int64_t q_stride, const float* k_cache,
                      const float* v_cache, int64_t past, int64_t new_tokens, int64_t heads,
                      int64_t kv_heads, int64_t head_dim);

}  // namespace loom::kernels::cpu
