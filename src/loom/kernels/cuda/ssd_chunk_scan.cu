#include "loom/kernels/cuda/ssd_chunk_scan.h"

#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cublas_handle.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/process_setting.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/ssd_chunks_scan.h"

namespace loom::kernels::cuda {

namespace {

using ssd_chunks::Product;

// Work memory per slice of groups: 256 MiB, or one group where that takes more (at 8192 tokens of
// 16 heads of 64 channels, state 128, chunks of 128: 1.35 GB in the backward).
constexpr int64_t kSliceBytes = int64_t{256} << 20;

template <class Step>
__global__ void chunk_step_kernel(int64_t n, Step step) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) step(i);
}

// A product's operand pointers, [A..., B..., C...] (cuBLAS's batched GEMMs take device arrays).
__global__ void product_pointers_kernel(double** pointers, Product p) {
  for (int64_t i = grid_start(); i < p.count; i += grid_stride()) {
    pointers[i] = ssd_chunks::operand_at(p, p.a, i);
    pointers[p.count + i] = ssd_chunks::operand_at(p, p.b, i);
    pointers[2 * p.count + i] = ssd_chunks::operand_at(p, p.c, i);
  }
}

int as_int(int64_t v, const char* what) {
  LOOM_CHECK(v <= std::numeric_limits<int>::max(), std::string("the chunked scan's ") + what + " " +
                                                       std::to_string(v) + " exceeds cuBLAS's int");
  return static_cast<int>(v);
}

// kernels/ssd_chunks_scan.h's executor on one stream; its work memory lives as long as it does.
class DeviceExecutor {
 public:
  explicit DeviceExecutor(cudaStream_t stream) : stream_(stream) {}

  template <class T>
  T* take(int64_t n) {
    return scratch_.of<T>(n);
  }

  template <class Step>
  void each(int64_t n, const Step& step) {
    if (n == 0) return;
    chunk_step_kernel<<<grid_for(n), kThreads, 0, stream_>>>(n, step);
    check_launch("chunk_step_kernel (the chunked scan's element steps)");
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B's pointers
  // first, with the widths swapped.
  void product(const Product& p) {
    if (p.count == 0) return;
    auto** pointers = scratch_.of<double*>(3 * p.count);
    product_pointers_kernel<<<grid_for(p.count), kThreads, 0, stream_>>>(pointers, p);
    check_launch("product_pointers_kernel");
    const double one = 1.0, beta = p.beta;
    CublasHandle& blas = cublas_handle();
    std::lock_guard<std::mutex> lock(blas.mutex);
    blas.bind(stream_);
    const cublasStatus_t status = cublasDgemmBatched(
        blas.handle, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(p.n, "width"),
        as_int(p.m, "height"), as_int(p.k, "depth"), &one, pointers + p.count, as_int(p.ldb, "leading dimension"),
        pointers, as_int(p.lda, "leading dimension"), &beta, pointers + 2 * p.count,
        as_int(p.ldc, "leading dimension"), as_int(p.count, "batch"));
    if (status != CUBLAS_STATUS_SUCCESS)
      throw Error("cuBLAS: cublasDgemmBatched of " + std::to_string(p.count) + " " + std::to_string(p.m) + " x " +
                  std::to_string(p.n) + " x " + std::to_string(p.k) + " products failed: " + cublas_status_text(status));
  }

 private:
  cudaStream_t stream_;
  Scratch scratch_;
};

int form_from_environment() {
  const char* value = std::getenv("LOOM_SSD_SCAN");
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "loops") return static_cast<int>(SsdScanForm::Loops);
  if (v == "chunks") return static_cast<int>(SsdScanForm::Chunks);
  throw Error("LOOM_SSD_SCAN=" + v + ": expected `loops` (the scan's (row, head) loops, the default) or `chunks` " +
              "(the chunk-parallel form on batched GEMMs)");
}
ProcessSetting form_setting(form_from_environment);

}  // namespace

SsdScanForm ssd_scan_form() { return static_cast<SsdScanForm>(form_setting.value()); }
void set_ssd_scan_form(int form) { form_setting.set(form); }

void ssd_chunk_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                            const float* B, const float* C, const float* D, const SsdShape& s,
                            const int32_t* documents, cudaStream_t stream) {
  DeviceExecutor ex(stream);
  ssd_chunks::forward(ex, y, {x, dt_raw, dt_bias, A_log, B, C, D, documents, nullptr, nullptr}, s, kSliceBytes);
}

void ssd_chunk_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC,
                             float* dD, const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                             const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                             const int32_t* documents, cudaStream_t stream) {
  DeviceExecutor ex(stream);
  ssd_chunks::backward(ex, {dx, ddt_raw, ddt_bias, dA_log, dB, dC, dD, dy},
                       {x, dt_raw, dt_bias, A_log, B, C, D, documents, nullptr, nullptr}, s, kSliceBytes);
}

void ssd_chunk_scan_continue(float* y, float* state, const float* x, const float* dt_raw, const float* dt_bias,
                             const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                             cudaStream_t stream) {
  DeviceExecutor ex(stream);
  ssd_chunks::forward(ex, y, {x, dt_raw, dt_bias, A_log, B, C, D, nullptr, state, state}, s, kSliceBytes);
}

}  // namespace loom::kernels::cuda
