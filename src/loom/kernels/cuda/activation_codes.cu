#include "loom/kernels/cuda/activation_codes.h"

#include <cuda_bf16.h>

#include "loom/kernels/cuda/activation_math.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/produced_codes.cuh"

namespace loom::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

// The activation's output [rows, width] at (r, c), from the bf16 input rows (SwiGLU's [gate | up]).
struct SwigluAt {
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const {
    return swiglu_value(load(in, r * 2 * width + c), load(in, r * 2 * width + width + c));
  }
};
// An elementwise activation's (GELU's, squared ReLU's) output at (r, c).
template <float (*kValue)(float)>
struct ValueAt {
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const { return kValue(load(in, r * width + c)); }
};

// The input gradient [rows, input width] at (r, c): SwiGLU's gate columns, then its up columns.
struct SwigluGradAt {
  const bf16* dout;
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const {
    const int64_t i = c < width ? c : c - width;
    const float g = load(in, r * 2 * width + i), dy = load(dout, r * width + i);
    return c < width ? swiglu_gate_grad(g, load(in, r * 2 * width + width + i), dy) : swiglu_up_grad(g, dy);
  }
};
// An elementwise activation's input gradient at (r, c).
template <float (*kGrad)(float, float)>
struct GradAt {
  const bf16* dout;
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const {
    const int64_t i = r * width + c;
    return kGrad(load(in, i), load(dout, i));
  }
};

const bf16* as_bf16(const void* p) { return static_cast<const bf16*>(p); }

}  // namespace

void activation_forward_codes(MlpActivation activation, const void* in16, int64_t rows, int64_t width,
                              const CastOperand& cast, void* codes, void* transposed, cudaStream_t stream) {
  const bf16* in = as_bf16(in16);
  const char* what = "activation_forward_codes";
  if (activation == MlpActivation::Swiglu) {
    write_produced_codes(SwigluAt{in, width}, cast, codes, transposed, rows, width, stream, what);
  } else if (activation == MlpActivation::Relu2) {
    write_produced_codes(ValueAt<relu2_value>{in, width}, cast, codes, transposed, rows, width, stream, what);
  } else {
    write_produced_codes(ValueAt<gelu_value>{in, width}, cast, codes, transposed, rows, width, stream, what);
  }
}

void activation_backward_codes(MlpActivation activation, const void* dout16, const void* in16, int64_t rows,
                               int64_t width, const CastOperand& cast, void* codes, void* transposed,
                               cudaStream_t stream) {
  const bf16 *dout = as_bf16(dout16), *in = as_bf16(in16);
  const char* what = "activation_backward_codes";
  if (activation == MlpActivation::Swiglu) {
    write_produced_codes(SwigluGradAt{dout, in, width}, cast, codes, transposed, rows, 2 * width, stream, what);
  } else if (activation == MlpActivation::Relu2) {
    write_produced_codes(GradAt<relu2_grad>{dout, in, width}, cast, codes, transposed, rows, width, stream, what);
  } else {
    write_produced_codes(GradAt<gelu_grad>{dout, in, width}, cast, codes, transposed, rows, width, stream, what);
  }
}

}  // namespace loom::kernels::cuda
