#include "loom/kernels/cuda/cudnn_builder.h"

#ifdef LOOM_HAVE_CUDNN_HEADERS
#include <algorithm>

#include "loom/core/error.h"

// The handle attributes are marked deprecated in cuDNN 9.x headers and remain the documented way
// to bind a graph and a plan to a handle.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace loom::kernels::cuda {

CudnnDescriptor::CudnnDescriptor(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
  check_cudnn(cudnn_api().create_descriptor(type, &descriptor_), "cudnnBackendCreateDescriptor (" + name_ + ")");
}

CudnnDescriptor::~CudnnDescriptor() {
  if (descriptor_ != nullptr) cudnn_api().destroy_descriptor(descriptor_);
}

void CudnnDescriptor::set(cudnnBackendAttributeName_t attribute, cudnnBackendAttributeType_t type, int64_t count,
                          const void* values) {
  check_cudnn(cudnn_api().set_attribute(descriptor_, attribute, type, count, values),
              "cudnnBackendSetAttribute (" + name_ + ", attribute " + std::to_string(attribute) + ")");
}

void CudnnDescriptor::finalize() {
  check_cudnn(cudnn_api().finalize(descriptor_), "cudnnBackendFinalize (" + name_ + ")");
}

CudnnDescriptor& CudnnGraph::keep(cudnnBackendDescriptorType_t type, const std::string& name) {
  kept_.push_back(std::make_unique<CudnnDescriptor>(type, name));
  return *kept_.back();
}

cudnnBackendDescriptor_t CudnnGraph::make_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
                                                 const Dims& strides, bool is_virtual, bool by_value) {
  CudnnDescriptor& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + std::to_string(uid));
  const int64_t alignment = 16;
  const bool virtual_flag = is_virtual;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()), dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()), strides.data());
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virtual_flag);
  if (by_value) {
    const bool flag = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &flag);
  }
  t.finalize();
  return t.get();
}

cudnnBackendDescriptor_t CudnnGraph::tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides) {
  LOOM_CHECK(uid < (1 << 20), "cuDNN graph: caller uid " + std::to_string(uid) + " beyond the caller's range");
  return make_tensor(uid, type, dims, strides, false, false);
}

cudnnBackendDescriptor_t CudnnGraph::virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
  return make_tensor(next_uid_++, type, dims, strides, true, false);
}

cudnnBackendDescriptor_t CudnnGraph::scalar(float value) {
  const int64_t uid = next_uid_++;
  scalars_.emplace_back(uid, std::make_unique<float>(value));
  return make_tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
}

void CudnnGraph::matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
  CudnnDescriptor& desc = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  desc.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  desc.finalize();
  CudnnDescriptor& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
  const cudnnBackendDescriptor_t d = desc.get();
  op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  add_operation(op);
}

void CudnnGraph::pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t x,
                           cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, int64_t axis, cudnnDataType_t math) {
  CudnnDescriptor& desc = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise mode " + std::to_string(mode));
  desc.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  desc.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (axis >= 0) desc.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  desc.finalize();
  CudnnDescriptor& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, desc.name() + " operation");
  const cudnnBackendDescriptor_t d = desc.get();
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  add_operation(op);
}

void CudnnGraph::reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  CudnnDescriptor& desc = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction " + std::to_string(reduce));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  desc.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
  desc.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  desc.finalize();
  CudnnDescriptor& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, desc.name() + " operation");
  const cudnnBackendDescriptor_t d = desc.get();
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  add_operation(op);
}

void CudnnGraph::reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  CudnnDescriptor& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  add_operation(op);
}

void CudnnGraph::build_plan(cudnnHandle_t handle) {
  graph_ = std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  graph_->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph_->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(operations_.size()),
              operations_.data());
  graph_->finalize();
  std::string refusals;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    CudnnDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    const cudnnBackendDescriptor_t g = graph_->get();
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    try {
      heuristics.finalize();
    } catch (const Error& e) {
      refusals += std::string(" heuristics mode ") + std::to_string(mode) + ": " + e.what() + ";";
      continue;
    }
    constexpr int kMaxConfigs = 16;
    std::vector<std::unique_ptr<CudnnDescriptor>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < kMaxConfigs; ++i) {
      configs.push_back(std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
      raw.push_back(configs.back()->get());
    }
    int64_t count = 0;
    check_cudnn(cudnn_api().get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &count, raw.data()),
                "cudnnBackendGetAttribute (engine heuristics results)");
    for (int64_t i = 0; i < std::min<int64_t>(count, kMaxConfigs); ++i) {
      auto plan = std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
      try {
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[size_t(i)]);
        plan->finalize();
      } catch (const Error& e) {
        refusals += std::string(" engine config ") + std::to_string(i) + ": " + e.what() + ";";
        continue;
      }
      int64_t got = 0;
      check_cudnn(cudnn_api().get_attribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                            &got, &workspace_),
                  "cudnnBackendGetAttribute (plan workspace size)");
      plan_ = std::move(plan);
      // The plan refers to its engine configuration: kept as long as the plan (cudnn-frontend
      // keeps it alive too; the backend API does not say it copies it).
      engine_config_ = std::move(configs[size_t(i)]);
      return;
    }
    if (count == 0) refusals += std::string(" heuristics mode ") + std::to_string(mode) + ": no engine;";
  }
  // cuDNN drops engines whose runtime prerequisites are missing (its SDPA engines compile at run
  // time: libcuda and a matching NVRTC) without saying so here; its own log does.
  throw Error("cuDNN: no engine finalises a plan for this graph:" + refusals +
              " (CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr makes cuDNN say why)");
}

void CudnnGraph::execute(cudnnHandle_t handle, std::vector<std::pair<int64_t, void*>> pointers, void* workspace) {
  LOOM_CHECK(plan_ != nullptr, "cuDNN graph executed before its plan was built");
  for (const auto& [uid, value] : scalars_) pointers.emplace_back(uid, value.get());
  std::vector<int64_t> uids;
  std::vector<void*> data;
  for (const auto& [uid, p] : pointers) {
    uids.push_back(uid);
    data.push_back(p);
  }
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(data.size()), data.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  check_cudnn(cudnn_api().execute(handle, plan_->get(), pack.get()), "cudnnBackendExecute");
}

}  // namespace loom::kernels::cuda
#endif
