#pragma once
// Norm module: RMSNorm or LayerNorm with its parameters (weight, and bias for LayerNorm).
#include <string>

#include "loom/model/buffers.h"
#include "loom/model/parameters.h"

namespace loom::model {

// A norm's output as the sub-block after it reads it: fp32 rows, or their bf16 form (2-byte
// elements) where that sub-block's first projection takes bf16 (Norm::forward's `bf16_out`).
// Made from fp32 rows implicitly: decoding, Mamba mixers and experts read fp32.
struct NormedRows {
  NormedRows(const float* rows) : fp32(rows) {}
  static NormedRows in_bf16(const void* rows) {
    NormedRows r(nullptr);
    r.bf16 = rows;
    return r;
  }
  const float* fp32 = nullptr;
  const void* bf16 = nullptr;
};

class Norm {
 public:
  struct Saved {
    Buffer out, mean, rstd;  // out: 2-byte elements when bf16
    bool bf16 = false;
  };
  // `placement`: how tensor-parallel ranks hold the weights (replicated; see TensorParallel).
  Norm(ParameterStore& store, const std::string& name, int dim, bool layer_norm, float eps,
       const ShardSpec& placement = {});
  // `bf16_out`: the output in bf16, each value the fp32 output rounded (kernels::rmsnorm_forward_bf16),
  // for a projection that casts it to bf16 anyway; the backward reads only the input and statistics.
  void forward(Saved& saved, const float* in, int64_t rows, bool bf16_out = false) const;
  // The output `saved` holds, as the next sub-block reads it.
  static NormedRows output(const Saved& saved);
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
