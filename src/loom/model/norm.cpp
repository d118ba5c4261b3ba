#include "loom/model/norm.h"

#include "loom/kernels/ops.h"

namespace loom::model {

Norm::Norm(ParameterStore& store, const std::string& name, int dim, bool layer_norm, float eps,
           const ShardSpec& placement)
    : store_(&store), dim_(dim), layer_norm_(layer_norm), eps_(eps) {
  weight_ = store.add(name + ".weight", {dim}, Init::Ones, 0.0f, placement);
  if (layer_norm) bias_ = store.add(name + ".bias", {dim}, Init::Zeros, 0.0f, placement);
}

void Norm::forward(Saved& saved, const float* in, int64_t rows, bool bf16_out) const {
  const Device device = store_->device();
  float* rstd = sized(saved.rstd, rows, device);
  float* mean = layer_norm_ ? sized(saved.mean, rows, device) : nullptr;
  saved.bf16 = bf16_out;
  if (bf16_out) {
    void* out16 = sized_16bit(saved.out, rows * dim_, device);
    if (layer_norm_) {
      kernels::layernorm_forward_bf16(device, out16, mean, rstd, in, store_->value(weight_), store_->value(bias_),
                                      rows, dim_, eps_);
    } else {
      kernels::rmsnorm_forward_bf16(device, out16, rstd, in, store_->value(weight_), rows, dim_, eps_);
    }
    return;
  }
  float* out = sized(saved.out, rows * dim_, device);
  if (layer_norm_) {
    kernels::layernorm_forward(device, out, mean, rstd, in, store_->value(weight_), store_->value(bias_), rows, dim_,
                               eps_);
  } else {
    kernels::rmsnorm_forward(device, out, rstd, in, store_->value(weight_), rows, dim_, eps_);
  }
}

void Norm::forward_added(Saved& saved, float* sum, const float* residual, const void* add16, int64_t rows) const {
  const Device device = store_->device();
  float* rstd = sized(saved.rstd, rows, device);
  float* mean = layer_norm_ ? sized(saved.mean, rows, device) : nullptr;
  saved.bf16 = true;
  void* out16 = sized_16bit(saved.out, rows * dim_, device);
  if (layer_norm_) {
    kernels::layernorm_add_forward_bf16(device, out16, mean, rstd, sum, residual, add16, store_->value(weight_),
                                        store_->value(bias_), rows, dim_, eps_);
  } else {
    kernels::rmsnorm_add_forward_bf16(device, out16, rstd, sum, residual, add16, store_->value(weight_), rows, dim_,
                                      eps_);
  }
}

void Norm::statistics(Saved& saved, const float* in, int64_t rows, float* amax) const {
  const Device device = store_->device();
  float* rstd = sized(saved.rstd, rows, device);
  float* mean = layer_norm_ ? sized(saved.mean, rows, device) : nullptr;
  saved.bf16 = false;
  release(saved.out);  // nothing kept: the codes go to the projection
  kernels::norm_statistics(device, mean, rstd, in, store_->value(weight_), layer_norm_ ? store_->value(bias_) : nullptr,
                           rows, dim_, eps_, amax);
}

void Norm::forward_codes(const Saved& saved, const float* in, int64_t rows, const kernels::CastOperand& cast,
                         void* codes, void* transposed) const {
  kernels::norm_forward_codes(store_->device(), in, store_->value(weight_),
                              layer_norm_ ? store_->value(bias_) : nullptr, layer_norm_ ? saved.mean.data() : nullptr,
                              saved.rstd.data(), rows, dim_, cast, codes, transposed);
}

NormedRows Norm::output(const Saved& saved) {
  return saved.bf16 ? NormedRows::in_bf16(saved.out.data()) : NormedRows(saved.out.data());
}

void Norm::backward(float* din, const float* dout, const float* in, const Saved& saved, int64_t rows, void* din16,
                    float* din_amax) const {
  if (layer_norm_) {
    kernels::layernorm_backward(store_->device(), din, store_->grad(weight_), store_->grad(bias_), dout, in,
                                store_->value(weight_), saved.mean.data(), saved.rstd.data(), rows, dim_, din16,
                                din_amax);
  } else {
    kernels::rmsnorm_backward(store_->device(), din, store_->grad(weight_), dout, in, store_->value(weight_),
                              saved.rstd.data(), rows, dim_, din16, din_amax);
  }
}

void Norm::backward_bf16(float* din, const void* dout16, const float* in, const Saved& saved, int64_t rows,
                         void* din16, float* din_amax) const {
  if (layer_norm_) {
    kernels::layernorm_backward_bf16(store_->device(), din, store_->grad(weight_), store_->grad(bias_), dout16, in,
                                     store_->value(weight_), saved.mean.data(), saved.rstd.data(), rows, dim_,
                                     din16, din_amax);
  } else {
    kernels::rmsnorm_backward_bf16(store_->device(), din, store_->grad(weight_), dout16, in, store_->value(weight_),
                                   saved.rstd.data(), rows, dim_, din16, din_amax);
  }
}

}  // namespace loom::model
