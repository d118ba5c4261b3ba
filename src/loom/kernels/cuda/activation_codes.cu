#include "loom/kernels/cuda/activation_codes.h"

#include <cuda_bf16.h>

#include "loom/kernels/cuda/activation_math.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/produced_codes.cuh"

namespace loom::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

// The activation's output [rows, width] at (r, c), from the bf16 input rows (SwiGLU's [gate | up]).
// read4 / value4 / packs4: the same four columns at a time (the packed kernel's, tiled_cast.cuh).
struct SwigluAt {
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const {
    return swiglu_value(load(in, r * 2 * width + c), load(in, r * 2 * width + width + c));
  }
  struct Reads {
    Pack4<bf16> g, u;
  };
  __device__ Reads read4(int64_t r, int64_t c) const {
    return {pack_at(in + r * 2 * width + c), pack_at(in + r * 2 * width + width + c)};
  }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = swiglu_value(load(a.g.v, k), load(a.u.v, k));
  }
  bool packs4() const { return pack4_aligned<bf16>(in) && width % 4 == 0; }
};
// An elementwise activation's (GELU's, squared ReLU's) output at (r, c).
template <float (*kValue)(float)>
struct ValueAt {
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const { return kValue(load(in, r * width + c)); }
  struct Reads {
    Pack4<bf16> x;
  };
  __device__ Reads read4(int64_t r, int64_t c) const { return {pack_at(in + r * width + c)}; }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = kValue(load(a.x.v, k));
  }
  bool packs4() const { return pack4_aligned<bf16>(in) && width % 4 == 0; }
};

// The input gradient [rows, input width] at (r, c): SwiGLU's gate columns, then its up columns.
// Two parts (tiled_cast.cuh): read4(r, c), c < width (a multiple of 4: packs4), loads the gate,
// up and output gradient at c once, and value4 sets both gradients from them, gate column c and up
// column width + c, so the packed kernel reads each input once, not once per part.
struct SwigluGradAt {
  static constexpr int kParts = 2;
  const bf16* dout;
  const bf16* in;
  int64_t width;
  __device__ float operator()(int64_t r, int64_t c) const {
    const int64_t i = c < width ? c : c - width;
    const float g = load(in, r * 2 * width + i), dy = load(dout, r * width + i);
    return c < width ? swiglu_gate_grad(g, load(in, r * 2 * width + width + i), dy) : swiglu_up_grad(g, dy);
  }
  struct Reads {
    Pack4<bf16> g, u, dy;
  };
  __device__ Reads read4(int64_t r, int64_t c) const {
    return {pack_at(in + r * 2 * width + c), pack_at(in + r * 2 * width + width + c), pack_at(dout + r * width + c)};
  }
  __device__ void value4(const Reads& a, float (&v)[kParts][4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float g = load(a.g.v, k), dy = load(a.dy.v, k);
      v[0][k] = swiglu_gate_grad(g, load(a.u.v, k), dy);
      v[1][k] = swiglu_up_grad(g, dy);
    }
  }
  bool packs4() const { return pack4_aligned<bf16>(dout) && pack4_aligned<bf16>(in) && width % 4 == 0; }
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
  struct Reads {
    Pack4<bf16> x, dy;
  };
  __device__ Reads read4(int64_t r, int64_t c) const {
    const int64_t i = r * width + c;
    return {pack_at(in + i), pack_at(dout + i)};
  }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = kGrad(load(a.x.v, k), load(a.dy.v, k));
  }
  bool packs4() const { return pack4_aligned<bf16>(dout) && pack4_aligned<bf16>(in) && width % 4 == 0; }
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
