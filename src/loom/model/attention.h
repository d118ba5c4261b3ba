#pragma once
// Self-attention sub-block: q/k/v projections (fused into one GEMM), RoPE, causal GQA
// attention, output projection added into the residual stream.
#include <string>

#include "loom/kernels/cpu/rope.h"
#include "loom/model/buffers.h"
#include "loom/model/parameters.h"

namespace loom::model {

// Keys and values of past positions for one sequence, [position, kv_heads*head_dim].
struct KVCache {
  Buffer keys, values;
};

class Attention {
 public:
  struct Saved {
    Buffer qkv, probs, att;
  };
  Attention(ParameterStore& store, const std::string& prefix, int d_model, int heads, int kv_heads, bool bias,
            const kernels::cpu::RopeTable* rope, float init_std, float out_std);
  // residual += o_proj(attention(normed)); normed is [batch*seq, d_model].
  void forward(Saved& saved, float* residual, const float* normed, int64_t batch, int64_t seq) const;
  void backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved,
                Workspace& work, int64_t batch, int64_t seq) const;
  // Inference on `rows` new positions of one sequence, appending to the cache (which holds `past`).
  void decode(float* residual, const float* normed, int64_t rows, int64_t past, KVCache& cache,
              Saved& scratch, int64_t max_positions) const;

 private:
  int64_t qkv_width() const { return static_cast<int64_t>(heads_ + 2 * kv_heads_) * head_dim_; }
  ParameterStore* store_;
  int d_model_, heads_, kv_heads_, head_dim_;
  const kernels::cpu::RopeTable* rope_;  // null for learned positions
  int qkv_weight_ = -1, qkv_bias_ = -1, out_weight_ = -1, out_bias_ = -1;
};

}  // namespace loom::model
