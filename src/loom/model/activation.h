#pragma once
// The feed-forward activations (model.activation) over [rows, ffn] features, for the dense MLP
// and the routed experts alike: SwiGLU reads [gate | up] rows of 2 ffn, GELU and squared ReLU
// (Nemotron-H's relu(x)^2) read ffn.
#include <cstdint>

#include "loom/config/enums.h"
#include "loom/core/device.h"
#include "loom/kernels/ops.h"

namespace loom::model {

// Width of the pre-activation rows.
inline int64_t activation_input_width(config::Activation activation, int64_t ffn) {
  return activation == config::Activation::Swiglu ? 2 * ffn : ffn;
}

inline void activation_forward(Device device, config::Activation activation, float* act, const float* hidden,
                               int64_t rows, int64_t ffn) {
  if (activation == config::Activation::Swiglu) {
    kernels::swiglu_forward(device, act, hidden, rows, ffn);
  } else if (activation == config::Activation::Relu2) {
    kernels::relu2_forward(device, act, hidden, rows * ffn);
  } else {
    kernels::gelu_forward(device, act, hidden, rows * ffn);
  }
}

// d_hidden from d_act (as the kernels do: written for these rows).
inline void activation_backward(Device device, config::Activation activation, float* d_hidden, const float* d_act,
                                const float* hidden, int64_t rows, int64_t ffn) {
  if (activation == config::Activation::Swiglu) {
    kernels::swiglu_backward(device, d_hidden, d_act, hidden, rows, ffn);
  } else if (activation == config::Activation::Relu2) {
    kernels::relu2_backward(device, d_hidden, d_act, hidden, rows * ffn);
  } else {
    kernels::gelu_backward(device, d_hidden, d_act, hidden, rows * ffn);
  }
}

// The same over bf16 tensors (Mlp::bf16_interior, bf16_hidden): act (fp32) or act16 (bf16, when act
// is null) from hidden16; d_hidden (fp32) or d_hidden16 (bf16, when d_hidden is null) from d_act16
// and hidden16, adding the fp32 d_hidden's column sums into d_bias (when not null: the up
// projection's bias gradient); with `amax`, the max |v| of the act or d_hidden written taken into it
// (a per-tensor FP8 layer's produced_amax); with neither output, that amax alone (of the fp32 values).
inline kernels::MlpActivation kernel_activation(config::Activation activation) {
  if (activation == config::Activation::Swiglu) return kernels::MlpActivation::Swiglu;
  if (activation == config::Activation::Relu2) return kernels::MlpActivation::Relu2;
  return kernels::MlpActivation::Gelu;
}
inline void activation_forward_bf16(Device device, config::Activation activation, float* act, void* act16,
                                    const void* hidden16, int64_t rows, int64_t ffn, float* amax = nullptr) {
  kernels::activation_forward_bf16(device, kernel_activation(activation), act, act16, hidden16, rows, ffn, amax);
}
inline void activation_backward_bf16(Device device, config::Activation activation, float* d_hidden, void* d_hidden16,
                                     float* d_bias, const void* d_act16, const void* hidden16, int64_t rows,
                                     int64_t ffn, float* amax = nullptr) {
  kernels::activation_backward_bf16(device, kernel_activation(activation), d_hidden, d_hidden16, d_bias, d_act16,
                                    hidden16, rows, ffn, amax);
}

}  // namespace loom::model
