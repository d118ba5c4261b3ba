#pragma once
// Operation graphs of cuDNN's backend API, built descriptor by descriptor (cudnn_library.h):
// tensors (device, virtual or by-value scalars), matmul, pointwise, reduction and reshape
// operations, then engine heuristics, an execution plan and its variant pack. Every call is
// checked with an Error naming it. Only where cuDNN's headers were found.
#ifdef LOOM_HAVE_CUDNN_HEADERS
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/kernels/cuda/cudnn_library.h"

namespace loom::kernels::cuda {

// One backend descriptor, destroyed with its owner.
class CudnnDescriptor {
 public:
  CudnnDescriptor(cudnnBackendDescriptorType_t type, std::string name);
  ~CudnnDescriptor();
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  void set(cudnnBackendAttributeName_t attribute, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  void finalize();
  cudnnBackendDescriptor_t get() const { return descriptor_; }
  const std::string& name() const { return name_; }

 private:
  cudnnBackendDescriptor_t descriptor_ = nullptr;
  std::string name_;
};

using Dims = std::vector<int64_t>;

// A graph in the making: tensors are named by the descriptors the builder keeps.
class CudnnGraph {
 public:
  // A device tensor the caller binds by `uid` at execution.
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides);
  // A tensor that only lives inside the fused kernel.
  cudnnBackendDescriptor_t virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides);
  // A by-value fp32 scalar (broadcast over every dimension).
  cudnnBackendDescriptor_t scalar(float value);

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c);
  // y = mode(x[, b][, t]); axis for GEN_INDEX; math precision FLOAT unless given.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b = nullptr, cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT);
  void reduction(cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);

  // Operation graph, heuristics (mode A, then fallback) and the first engine configuration that
  // finalises into a plan. Throws naming every engine's refusal when none does.
  void build_plan(cudnnHandle_t handle);
  int64_t workspace_bytes() const { return workspace_; }
  // Runs the plan with device pointers (and the scalars' host values) bound to their uids.
  void execute(cudnnHandle_t handle, std::vector<std::pair<int64_t, void*>> pointers, void* workspace);

 private:
  CudnnDescriptor& keep(cudnnBackendDescriptorType_t type, const std::string& name);
  cudnnBackendDescriptor_t make_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                       bool is_virtual, bool by_value);
  void add_operation(CudnnDescriptor& op) {
    op.finalize();
    operations_.push_back(op.get());
  }

  std::vector<std::unique_ptr<CudnnDescriptor>> kept_;
  std::vector<cudnnBackendDescriptor_t> operations_;
  std::vector<std::pair<int64_t, std::unique_ptr<float>>> scalars_;  // uid, host value
  int64_t next_uid_ = 1 << 20;  // virtual and scalar tensors; callers' uids stay below
  std::unique_ptr<CudnnDescriptor> graph_, engine_config_, plan_;  // the plan last: destroyed first
  int64_t workspace_ = 0;
};

}  // namespace loom::kernels::cuda
#endif
