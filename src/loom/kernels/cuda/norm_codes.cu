#include "loom/kernels/cuda/norm_codes.h"

#include "loom/kernels/cuda/layernorm.h"
#include "loom/kernels/cuda/norm_math.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/rmsnorm.h"
#include "loom/kernels/cuda/produced_codes.cuh"

namespace loom::kernels::cuda {

namespace {

// The norm's output at (r, c); read4 / value4 / packs4: four columns at a time (the packed
// kernel's, tiled_cast.cuh).
struct RmsAt {
  const float *in, *weight, *rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const { return rms_value(in[r * dim + c], rstd[r], weight[c]); }
  struct Reads {
    Pack4<float> x, w;
    float rstd;
  };
  __device__ Reads read4(int64_t r, int64_t c) const {
    return {pack_at(in + r * dim + c), pack_at(weight + c), rstd[r]};
  }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = rms_value(a.x.v[k], a.rstd, a.w.v[k]);
  }
  bool packs4() const { return pack4_aligned<float>(in) && pack4_aligned<float>(weight) && dim % 4 == 0; }
};
struct LayerAt {
  const float *in, *weight, *bias, *mean, *rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const {
    return layer_value(in[r * dim + c], mean[r], rstd[r], weight[c], bias[c]);
  }
  struct Reads {
    Pack4<float> x, w, b;
    float mean, rstd;
  };
  __device__ Reads read4(int64_t r, int64_t c) const {
    return {pack_at(in + r * dim + c), pack_at(weight + c), pack_at(bias + c), mean[r], rstd[r]};
  }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = layer_value(a.x.v[k], a.mean, a.rstd, a.w.v[k], a.b.v[k]);
  }
  bool packs4() const {
    return pack4_aligned<float>(in) && pack4_aligned<float>(weight) && pack4_aligned<float>(bias) && dim % 4 == 0;
  }
};

}  // namespace

void norm_statistics(float* mean, float* rstd, const float* in, const float* weight, const float* bias, int64_t rows,
                     int64_t dim, float eps, float* amax, cudaStream_t stream) {
  if (mean != nullptr) {
    layernorm_statistics(mean, rstd, in, weight, bias, rows, dim, eps, amax, stream);
  } else {
    rmsnorm_statistics(rstd, in, weight, rows, dim, eps, amax, stream);
  }
}

void norm_forward_codes(const float* in, const float* weight, const float* bias, const float* mean, const float* rstd,
                        int64_t rows, int64_t dim, const CastOperand& cast, void* codes, void* transposed,
                        cudaStream_t stream) {
  const char* what = "norm_forward_codes";
  if (mean != nullptr) {
    write_produced_codes(LayerAt{in, weight, bias, mean, rstd, dim}, cast, codes, transposed, rows, dim, stream, what);
  } else {
    write_produced_codes(RmsAt{in, weight, rstd, dim}, cast, codes, transposed, rows, dim, stream, what);
  }
}

}  // namespace loom::kernels::cuda
