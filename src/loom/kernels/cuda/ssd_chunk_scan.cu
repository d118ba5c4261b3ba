#include "loom/kernels/cuda/ssd_chunk_scan.h"

#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cublas_handle.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/process_setting.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/ssd_chunks_scan.h"

namespace loom::kernels::cuda {

namespace {

using ssd_chunks::Product;
using ssd_chunks::Inputs;

// Work memory per slice of heads: 256 MiB (whole groups, else part of one: at 8192 tokens of a
// group of 16 heads of 64 channels, state 128, chunks of 128, two heads a slice in the backward,
// 211 MB, where the whole group would take 1.35 GB).
constexpr int64_t kSliceBytes = int64_t{256} << 20;

template <class Step>
__global__ void chunk_step_kernel(int64_t n, Step step) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) step(i);
}

// A product's operand pointers, [A..., B..., C...] (cuBLAS's batched GEMMs take device arrays).
template <typename Real>
__global__ void product_pointers_kernel(Real** pointers, Product<Real> p) {
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

  // The row-major product as cuBLAS's column-major call (ssd_chunks::column_major: B's pointers
  // first). Doubles on the FP64 tensor cores; floats on the TF32 ones (fp32 accumulation).
  template <typename Real>
  void product(const Product<Real>& p) {
    if (p.count == 0) return;
    auto** pointers = scratch_.of<Real*>(3 * p.count);
    product_pointers_kernel<Real><<<grid_for(p.count), kThreads, 0, stream_>>>(pointers, p);
    check_launch("product_pointers_kernel");
    const Real one = 1, beta = static_cast<Real>(p.beta);
    const ssd_chunks::ColumnMajorCall call = ssd_chunks::column_major(p);
    const cublasOperation_t op_b = call.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = call.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int m = as_int(call.m, "width"), n = as_int(call.n, "height"), k = as_int(call.k, "depth");
    const int lda = as_int(call.ld_first, "leading dimension"), ldb = as_int(call.ld_second, "leading dimension");
    const int ldc = as_int(call.ldc, "leading dimension"), count = as_int(p.count, "batch");
    CublasHandle& blas = cublas_handle();
    std::lock_guard<std::mutex> lock(blas.mutex);
    blas.bind(stream_);
    cublasStatus_t status;
    if constexpr (std::is_same_v<Real, double>) {
      status = cublasDgemmBatched(blas.handle, op_b, op_a, m, n, k, &one, pointers + p.count, lda, pointers, ldb, &beta,
                                  pointers + 2 * p.count, ldc, count);
    } else {
      auto** any = reinterpret_cast<void**>(pointers);
      status = cublasGemmBatchedEx(blas.handle, op_b, op_a, m, n, k, &one, any + p.count, CUDA_R_32F, lda, any,
                                   CUDA_R_32F, ldb, &beta, any + 2 * p.count, CUDA_R_32F, ldc, count,
                                   CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    }
    if (status != CUBLAS_STATUS_SUCCESS)
      throw Error(std::string("cuBLAS: the chunked scan's batched ") + (sizeof(Real) == 8 ? "DGEMM" : "TF32 GEMM") +
                  " of " + std::to_string(p.count) + " " + std::to_string(p.m) + " x " + std::to_string(p.n) + " x " +
                  std::to_string(p.k) + " products failed: " + cublas_status_text(status));
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
  if (v == "chunks-tf32") return static_cast<int>(SsdScanForm::ChunksTf32);
  throw Error("LOOM_SSD_SCAN=" + v + ": expected `loops` (the scan's (row, head) loops, the default), `chunks` " +
              "(the chunk-parallel form on batched DGEMMs) or `chunks-tf32` (the same in fp32 on TF32 tensor cores)");
}
ProcessSetting form_setting(form_from_environment);

// The forward in the form ssd_scan_form() names (Chunks unless ChunksTf32).
void forward_in_form(float* y, const Inputs& in, const SsdShape& s, cudaStream_t stream) {
  DeviceExecutor ex(stream);
  if (ssd_scan_form() == SsdScanForm::ChunksTf32) return ssd_chunks::forward<float>(ex, y, in, s, kSliceBytes);
  ssd_chunks::forward<double>(ex, y, in, s, kSliceBytes);
}

}  // namespace

SsdScanForm ssd_scan_form() { return static_cast<SsdScanForm>(form_setting.value()); }
void set_ssd_scan_form(int form) { form_setting.set(form); }
bool ssd_scan_in_chunks() { return ssd_scan_form() != SsdScanForm::Loops; }

void ssd_chunk_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                            const float* B, const float* C, const float* D, const SsdShape& s,
                            const int32_t* documents, cudaStream_t stream) {
  forward_in_form(y, {x, dt_raw, dt_bias, A_log, B, C, D, documents, nullptr, nullptr}, s, stream);
}

void ssd_chunk_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC,
                             float* dD, const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                             const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                             const int32_t* documents, cudaStream_t stream) {
  DeviceExecutor ex(stream);
  const ssd_chunks::Grads out{dx, ddt_raw, ddt_bias, dA_log, dB, dC, dD, dy};
  const Inputs in{x, dt_raw, dt_bias, A_log, B, C, D, documents, nullptr, nullptr};
  if (ssd_scan_form() == SsdScanForm::ChunksTf32) return ssd_chunks::backward<float>(ex, out, in, s, kSliceBytes);
  ssd_chunks::backward<double>(ex, out, in, s, kSliceBytes);
}

void ssd_chunk_scan_continue(float* y, float* state, const float* x, const float* dt_raw, const float* dt_bias,
                             const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                             cudaStream_t stream) {
  forward_in_form(y, {x, dt_raw, dt_bias, A_log, B, C, D, nullptr, state, state}, s, stream);
}

}  // namespace loom::kernels::cuda
