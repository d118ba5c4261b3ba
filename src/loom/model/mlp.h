#pragma once
// MLP sub-block: SwiGLU (gate_proj, up_proj, down_proj; gate and up fused into one GEMM) or
// GELU (up_proj, down_proj, as GPT-2's c_fc / c_proj).
#include <string>

#include "loom/model/buffers.h"
#include "loom/model/parameters.h"

namespace loom::model {

class Mlp {
 public:
  struct Saved {
    Buffer hidden, act;  // hidden = [gate | up] rows for SwiGLU, pre-activation for GELU
  };
  Mlp(ParameterStore& store, const std::string& prefix, int d_model, int ffn_size, bool swiglu, bool bias,
      float init_std, float out_std);
  // residual += down(act(up(normed)))
  void forward(Saved& saved, float* residual, const float* normed, int64_t rows) const;
  // d_normed += d/d(normed) of the branch, given d_residual; parameter gradients into the store.
  void backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved,
                Workspace& work, int64_t rows) const;

 private:
  int hidden_width() const { return swiglu_ ? 2 * ffn_ : ffn_; }
  ParameterStore* store_;
  int d_model_, ffn_;
  bool swiglu_;
  int in_weight_ = -1, in_bias_ = -1, down_weight_ = -1, down_bias_ = -1;
};

}  // namespace loom::model
