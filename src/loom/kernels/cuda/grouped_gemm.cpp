#include "loom/kernels/cuda/grouped_gemm.h"

#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cublas_handle.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/per_device.h"
#include "loom/kernels/cuda/precision_gemm.h"
#include "loom/kernels/cuda/process_setting.h"
#include "loom/kernels/cuda/say_once.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/upload_staging.h"

namespace loom::kernels::cuda {

namespace {

constexpr int64_t kDefaultMostRows = 256, kMostRowsLimit = int64_t{1} << 20;

// The setting holds rows + 1: ProcessSetting's 0 is "not set".
int most_rows_from_environment() {
  const char* value = std::getenv("LOOM_GROUPED_GEMM_ROWS");
  const std::string v = value != nullptr ? value : "";
  if (v.empty()) return static_cast<int>(kDefaultMostRows + 1);
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() + v.size() && n >= 0 && n <= kMostRowsLimit) return static_cast<int>(n + 1);
  throw Error("LOOM_GROUPED_GEMM_ROWS=" + v + ": expected the largest mean rows per GEMM at which an MoE layer's " +
              "experts' GEMMs run as one grouped product, from 0 (never) to " + std::to_string(kMostRowsLimit) +
              " (unset: " + std::to_string(kDefaultMostRows) + ")");
}
ProcessSetting most_rows_setting(most_rows_from_environment);

std::atomic<int64_t> grouped_count{0}, refused_count{0};

// What one grouped product writes: bf16 outputs (out16), fp32 outputs rounded to bf16 (written by
// the product in bf16 into scratch, then widened into place: cuBLAS's grouped bf16 kernels write
// bf16), or a weight gradient's fp32 (written or added into).
enum class Output { Bf16, RoundedFp32, Fp32 };
constexpr int kOutputs = 3;

// One device's staging for the pointer arrays (64 slots: a few uploads per MoE layer and
// micro-batch, and the host may run many layers ahead) and the output kinds cuBLAS refused a
// grouped product of (not asked again); the products themselves go through the device's cuBLAS
// handle (cublas_handle.h).
struct Context {
  explicit Context(int device) : uploads(device, 64) {}
  std::mutex mutex;
  UploadStaging uploads;
  bool refused[kOutputs] = {false, false, false};
};

Context& context() {
  return current_device_object<Context>("cuBLAS grouped GEMM", [] {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    return std::make_unique<Context>(device);
  });
}

Output output_of(const PrecisionGemm& g) {
  if (g.out16 != nullptr) return Output::Bf16;
  return g.rounding == OutputRounding::Bf16 ? Output::RoundedFp32 : Output::Fp32;
}

// The output's width: a forward's out_features, a dgrad's in_features (a wgrad's is in_features too,
// over out_features rows).
int64_t output_width(const PrecisionGemm& g) {
  return g.pass == LinearGemm::Forward ? g.out_features : g.in_features;
}

// One GEMM in cuBLAS's column-major terms: C (m x n, ldc) = op(A) (m x k) . op(B) (k x n). A
// row-major [r, c] matrix is its column-major transpose with leading dimension c, so (kernels/
// precision_gemm.h's shapes, IC in, OC out features):
//   Forward    out^T [OC, n]  = W . in^T       A = W  (T, ld IC), B = in   (N, ld IC)
//   DataGrad   din^T [IC, n]  = W^T . dout^T   A = W  (N, ld IC), B = dout (N, ld OC)
//   WeightGrad dW^T [IC, OC]  = in^T . dout    A = in (N, ld IC), B = dout (T, ld OC)
// `c`: where the product writes (a rounded fp32 output's bf16 scratch).
struct Problem {
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  float beta = 0.0f;
};

Problem problem_of(const PrecisionGemm& g, void* c) {
  const int64_t in = g.in_features, out = g.out_features;
  Problem p;
  p.c = c;
  p.beta = g.accumulate ? 1.0f : 0.0f;
  switch (g.pass) {
    case LinearGemm::Forward:
      p.transa = CUBLAS_OP_T, p.m = out, p.n = g.n, p.k = in, p.a = g.b_store, p.lda = in, p.b = g.a16, p.ldb = in;
      p.ldc = out;
      break;
    case LinearGemm::DataGrad:
      p.m = in, p.n = g.n, p.k = out, p.a = g.b_store, p.lda = in, p.b = g.a16, p.ldb = out, p.ldc = in;
      break;
    case LinearGemm::WeightGrad:
      p.transb = CUBLAS_OP_T, p.m = in, p.n = out, p.k = g.n, p.a = g.b16, p.lda = in, p.b = g.a16, p.ldb = out;
      p.ldc = in;
      break;
  }
  return p;
}

// cuBLAS's grouped bf16 kernels load 16 bytes at a time and cannot check pointers it reads from a
// device array: a GEMM joins a group only with every operand 16-byte aligned and both widths a
// multiple of 8 (every row of a bf16 or fp32 operand a multiple of 16 bytes). A rounded fp32
// output's product goes to scratch laid out that way; the pass widening it into place takes any.
bool aligned(const PrecisionGemm& g) {
  const auto at16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const Output kind = output_of(g);
  const void* out = kind == Output::Bf16 ? g.out16 : static_cast<const void*>(g.out);
  const void* b = g.pass == LinearGemm::WeightGrad ? g.b16 : g.b_store;
  return at16(g.a16) && at16(b) && (kind == Output::RoundedFp32 || at16(out)) && g.in_features % 8 == 0 &&
         g.out_features % 8 == 0;
}

// Whether the GEMMs of one output kind are worth one grouped product: several, and small.
bool worth_grouping(const std::vector<const PrecisionGemm*>& gemms) {
  const int64_t most = grouped_gemm_most_rows();
  if (gemms.size() < 2 || most == 0) return false;
  int64_t rows = 0;
  for (const PrecisionGemm* g : gemms) rows += g->n;
  return rows <= most * static_cast<int64_t>(gemms.size());
}

// The GEMMs' products into `outputs` (one per GEMM) as one cuBLAS grouped product, each GEMM its
// own group of one, its pointer arrays in `scratch` (the caller's: one Scratch per call at a time);
// false (nothing run, remembered) where cuBLAS refuses that output kind.
bool run_grouped(const std::vector<const PrecisionGemm*>& gemms, const std::vector<void*>& outputs, Output kind,
                 Scratch& scratch, cudaStream_t stream) {
  Context& ctx = context();
  {
    std::lock_guard<std::mutex> lock(ctx.mutex);
    if (ctx.refused[static_cast<int>(kind)]) {
      ++refused_count;
      return false;
    }
  }
#if CUBLAS_VERSION >= 120500
  const size_t count = gemms.size();
  std::vector<cublasOperation_t> transa(count), transb(count);
  std::vector<int64_t> m(count), n(count), k(count), lda(count), ldb(count), ldc(count), group_size(count, 1);
  std::vector<float> alpha(count, 1.0f), beta(count);
  std::vector<const void*> pointers(3 * count);  // A, then B, then C
  for (size_t i = 0; i < count; ++i) {
    const Problem p = problem_of(*gemms[i], outputs[i]);
    transa[i] = p.transa, transb[i] = p.transb, m[i] = p.m, n[i] = p.n, k[i] = p.k;
    lda[i] = p.lda, ldb[i] = p.ldb, ldc[i] = p.ldc, beta[i] = p.beta;
    pointers[i] = p.a, pointers[count + i] = p.b, pointers[2 * count + i] = p.c;
  }
  const size_t bytes = pointers.size() * sizeof(void*);
  LOOM_CHECK(UploadStaging::takes(bytes), "grouped GEMM: " + std::to_string(count) + " GEMMs in one call, more than " +
                                              "its pointer arrays' staging holds");
  auto** on_device = static_cast<void**>(scratch.bytes(static_cast<int64_t>(bytes)));
  std::lock_guard<std::mutex> lock(ctx.mutex);
  ctx.uploads.upload(on_device, pointers.data(), bytes, stream);
  CublasHandle& blas = cublas_handle();
  std::lock_guard<std::mutex> blas_lock(blas.mutex);
  blas.bind(stream);
  const cudaDataType_t c_type = kind == Output::Fp32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasStatus_t status = cublasGemmGroupedBatchedEx_64(
      blas.handle, transa.data(), transb.data(), m.data(), n.data(), k.data(), alpha.data(), on_device, CUDA_R_16BF,
      lda.data(), on_device + count, CUDA_R_16BF, ldb.data(), beta.data(), on_device + 2 * count, c_type, ldc.data(),
      static_cast<int64_t>(count), group_size.data(), CUBLAS_COMPUTE_32F);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH) {
    ctx.refused[static_cast<int>(kind)] = true;
    ++refused_count;
    say_once(std::string("grouped GEMMs one by one: cuBLAS refuses a grouped product of bf16 operands into ") +
             (kind == Output::Fp32 ? "fp32" : "bf16") + ": " + cublas_status_text(status));
    return false;
  }
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error("cuBLAS: cublasGemmGroupedBatchedEx of " + std::to_string(count) + " GEMMs failed: " +
                cublas_status_text(status));
  ++grouped_count;
  return true;
#else
  (void)gemms, (void)outputs, (void)scratch, (void)stream;
  std::lock_guard<std::mutex> lock(ctx.mutex);
  ctx.refused[static_cast<int>(kind)] = true;
  ++refused_count;
  say_once("grouped GEMMs one by one: this cuBLAS (before 12.5) has no grouped products");
  return false;
#endif
}

// Rounded fp32 outputs: the products into one bf16 scratch, each GEMM's rows after the last's in the
// order of their outputs' addresses, then widened into place, one pass per run of adjacent outputs
// (an MoE layer's experts write consecutive rows of one tensor).
bool run_rounded(std::vector<const PrecisionGemm*> gemms, cudaStream_t stream) {
  std::sort(gemms.begin(), gemms.end(), [](const PrecisionGemm* x, const PrecisionGemm* y) { return x->out < y->out; });
  int64_t total = 0;
  for (const PrecisionGemm* g : gemms) total += g->n * output_width(*g);
  Scratch scratch;
  auto* bf16 = static_cast<uint16_t*>(scratch.bytes(total * 2));
  std::vector<void*> outputs;
  int64_t at = 0;
  for (const PrecisionGemm* g : gemms) {
    outputs.push_back(bf16 + at);
    at += g->n * output_width(*g);
  }
  if (!run_grouped(gemms, outputs, Output::RoundedFp32, scratch, stream)) return false;
  for (size_t i = 0; i < gemms.size();) {
    float* start = gemms[i]->out;
    const auto* from = static_cast<const uint16_t*>(outputs[i]);
    int64_t length = gemms[i]->n * output_width(*gemms[i]);
    for (++i; i < gemms.size() && gemms[i]->out == start + length; ++i) length += gemms[i]->n * output_width(*gemms[i]);
    finish_output(start, from, true, nullptr, 1, length, OutputRounding::None, false, stream);
  }
  return true;
}

}  // namespace

int64_t grouped_gemm_most_rows() { return most_rows_setting.value() - 1; }

void set_grouped_gemm_most_rows(int64_t rows) {
  LOOM_CHECK(rows >= -1 && rows <= kMostRowsLimit, "set_grouped_gemm_most_rows(" + std::to_string(rows) +
                                                       "): expected 0 to " + std::to_string(kMostRowsLimit) +
                                                       ", or -1 for LOOM_GROUPED_GEMM_ROWS's");
  most_rows_setting.set(static_cast<int>(rows + 1));
}

GroupedGemmCounts grouped_gemm_counts() { return {grouped_count.load(), refused_count.load()}; }

void precision_linear_gemms(const PrecisionGemm* gemms, int64_t count, cudaStream_t stream) {
  // The GEMMs are independent, so their order is free: those not grouped run first, as they come.
  std::vector<const PrecisionGemm*> by_output[kOutputs];
  for (int64_t i = 0; i < count; ++i) {
    const PrecisionGemm& g = gemms[i];
    const bool sized = g.n > 0 && g.in_features > 0 && g.out_features > 0;
    if (sized && groupable(g) && aligned(g)) {
      by_output[static_cast<int>(output_of(g))].push_back(&g);
    } else {
      precision_linear_gemm(g, stream);
    }
  }
  for (const Output kind : {Output::Bf16, Output::RoundedFp32, Output::Fp32}) {
    const std::vector<const PrecisionGemm*>& same = by_output[static_cast<int>(kind)];
    bool done = false;
    if (worth_grouping(same)) {
      if (kind == Output::RoundedFp32) {
        done = run_rounded(same, stream);
      } else {
        std::vector<void*> outputs;
        for (const PrecisionGemm* g : same) outputs.push_back(kind == Output::Bf16 ? g->out16 : g->out);
        Scratch scratch;
        done = run_grouped(same, outputs, kind, scratch, stream);
      }
    }
    if (!done)
      for (const PrecisionGemm* g : same) precision_linear_gemm(*g, stream);  // after the scratch went back
  }
}

}  // namespace loom::kernels::cuda
