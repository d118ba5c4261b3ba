#pragma once
// Norm module: RMSNorm or LayerNorm with its parameters (weight, and bias for LayerNorm).
#include <string>

#include "loom/kernels/precision_gemm.h"
#include "loom/model/buffers.h"
#include "loom/model/linear_precision.h"
#include "loom/model/parameters.h"

namespace loom::model {

// A norm's output as the sub-block after it reads it: fp32 rows, their bf16 form (2-byte
// elements) where that sub-block's first projection takes bf16 (Norm::forward's `bf16_out`), or
// their FP8 codes where it takes its input as codes the norm writes (Norm::forward_codes; the
// transposed codes already in the projection's kept input codes). Made from fp32 rows implicitly:
// decoding, Mamba mixers and experts read fp32.
struct NormedRows {
  NormedRows(const float* rows) : fp32(rows) {}
  static NormedRows in_bf16(const void* rows) {
    NormedRows r(nullptr);
    r.bf16 = rows;
    return r;
  }
  static NormedRows in_codes(const void* codes) {
    NormedRows r(nullptr);
    r.codes = codes;
    return r;
  }
  // What the first projection's forward takes beside the fp32 rows: the bf16 rows and where it
  // keeps its input's codes (`keep_input_codes`), or the codes alone.
  DeviceTensors forward_tensors(void* keep_input_codes) const {
    if (codes != nullptr) return DeviceTensors{.in_codes = codes};
    return DeviceTensors{.in = bf16, .keep_input_codes = keep_input_codes};
  }
  const float* fp32 = nullptr;
  const void* bf16 = nullptr;
  const void* codes = nullptr;
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
  // The residual add before the norm and the norm in one pass (kernels::rmsnorm_add_forward_bf16):
  // sum = residual + add16 (a bf16 product: the stream's next tensor, written), then the bf16
  // forward of sum as forward(saved, sum, rows, true) computes it.
  void forward_added(Saved& saved, float* sum, const float* residual, const void* add16, int64_t rows) const;
  // The output `saved` holds, as the next sub-block reads it (none after forward_codes).
  static NormedRows output(const Saved& saved);
  // Where the projection after the norm takes its input as FP8 codes the norm writes (per-tensor
  // FP8 on a GPU: Attention / Mlp::takes_input_codes), in two passes over the input
  // (kernels::norm_statistics, norm_forward_codes): statistics() saves the statistics for backward
  // and, given `amax`, takes the outputs' amax (fp8_current's scale needs it first); forward_codes()
  // then casts the outputs as `cast` says into codes and transposed codes. No output is written or
  // kept: the backward reads only the input and the statistics.
  void statistics(Saved& saved, const float* in, int64_t rows, float* amax) const;
  void forward_codes(const Saved& saved, const float* in, int64_t rows, const kernels::CastOperand& cast, void* codes,
                     void* transposed) const;
  // din += d(norm)/d(in) . dout; parameter gradients added into the store. `din16` (null: none):
  // din's new values rounded to bf16 as well; `din_amax` (null: none): their max |value| taken into
  // it; both from the same pass (ResidualGradForReader).
  void backward(float* din, const float* dout, const float* in, const Saved& saved, int64_t rows,
                void* din16 = nullptr, float* din_amax = nullptr) const;
  // The same over dout in bf16 (2-byte elements: a bf16 projection's input gradient), bit for bit
  // the fp32 form's on its values widened.
  void backward_bf16(float* din, const void* dout16, const float* in, const Saved& saved, int64_t rows,
                     void* din16 = nullptr, float* din_amax = nullptr) const;

 private:
  ParameterStore* store_;
  int dim_;
  bool layer_norm_;
  float eps_;
  int weight_ = -1, bias_ = -1;
};

}  // namespace loom::model
