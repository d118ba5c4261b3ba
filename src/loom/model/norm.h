#pragma once
// Norm module: RMSNorm or LayerNorm with its parameters (weight, and bias for LayerNorm).
#include <string>

#include "loom/model/buffers.h"
#include "loom/model/parameters.h"

namespace loom::model {

class Norm {
 public:
  struct Saved {
    Buffer out, mean, rstd;
  };
  // `placement`: how tensor-parallel ranks hold the weights (replicated; see TensorParallel).
  Norm(ParameterStore& store, const std::string& name, int dim, bool layer_norm, float eps,
       const ShardSpec& placement = {});
  void forward(Saved& saved, const float* in, int64_t rows) const;
  // din += d(norm)/d(in) . dout; parameter gradients added into the store.
  void backward(float* din, const float* dout, const float* in, const Saved& saved, int64_t rows) const;

 private:
  ParameterStore* store_;
  int dim_;
  bool layer_norm_;
  float eps_;
  int weight_ = -1, bias_ = -1;
};

}  // namespace loom::model
