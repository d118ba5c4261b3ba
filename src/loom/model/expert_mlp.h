#pragma once
// This rank's routed experts as one grouped GEMM: rows arrive grouped by expert (expert_rows[j]
// rows for local expert j, back to back) and each expert is an MLP over its
// contiguous row range, one BLAS GEMM per expert and projection through kernels/ops.h. The
// activation is the model's (SwiGLU, GELU, or squared ReLU: Nemotron-H's latent MoE). Each
// expert's parameters are global tensors of their own (model.layers.N.mlp.experts.E.*), so a
// checkpoint loads into any expert-parallel size. Expert GEMMs run in fp32.
#include <string>
#include <vector>

#include "loom/model/activation.h"
#include "loom/model/buffers.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

class ExpertMlp {
 public:
  struct Saved {
    Buffer hidden, act;
  };
  // Registers experts [first, first + count) of width `width` (d_model or the latent size).
  ExpertMlp(ParameterStore& store, const TensorParallel& tp, const std::string& prefix, int first, int count,
            int width, int ffn_size, config::Activation activation, float init_std, float out_std);
  int count() const { return count_; }
  // out[rows, width] = expert(in) per expert's row range.
  void forward(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows) const;
  // d_in (overwritten) and the parameters' gradients from d_out.
  void backward(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                const std::vector<int64_t>& expert_rows) const;

 private:
  int hidden_width() const { return static_cast<int>(activation_input_width(activation_, ffn_)); }
  ParameterStore* store_;
  Device device_;
  int count_, width_, ffn_;
  config::Activation activation_;
  std::vector<int> in_, down_;  // per local expert: [gate; up] (or up) weight id, down weight id
};

}  // namespace loom::model
