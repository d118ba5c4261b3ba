#pragma once
// Independent GEMMs of several linear layers gathered into one call of
// kernels::precision_linear_gemms: an MoE layer's experts' GEMMs of one pass, which a GPU runs as
// one grouped product (kernels/cuda/grouped_gemm.h) where it would otherwise make one cuBLASLt call
// per expert. A layer handed a group (DeviceTensors::group) adds its groupable GEMMs to it
// (kernels::groupable: bf16 tensors and ready weight casts in, nothing else written) and runs any
// other at once; run() issues what was added. The caller promises that the GEMMs added before a
// run() are independent (none reads what another writes) and that what they read keeps its
// values until then. A group dropped before run() (an exception) issues nothing.
#include <cstdint>
#include <vector>

#include "loom/core/device.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/precision_gemm.h"

namespace loom::model {

class GemmGroup {
 public:
  explicit GemmGroup(Device device) : device_(device) {}
  void add(const kernels::PrecisionGemm& gemm) { gemms_.push_back(gemm); }
  void run() {
    kernels::precision_linear_gemms(device_, gemms_.data(), static_cast<int64_t>(gemms_.size()));
    gemms_.clear();
  }

 private:
  Device device_;
  std::vector<kernels::PrecisionGemm> gemms_;
};

}  // namespace loom::model
