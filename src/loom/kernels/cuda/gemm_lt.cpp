#include "loom/kernels/cuda/gemm_lt.h"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/gemm_autotune.h"
#include "loom/kernels/cuda/per_device.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/stream_workspaces.h"

namespace loom::kernels::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

void check_lt(cublasStatus_t status, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error("cuBLASLt: " + what + " failed: " + cublasLtGetStatusName(status) + " (" +
                cublasLtGetStatusString(status) + ")");
  }
}

cudaDataType_t cuda_type(GemmType t) {
  switch (t) {
    case GemmType::F32: return CUDA_R_32F;
    case GemmType::BF16: return CUDA_R_16BF;
    case GemmType::F16: return CUDA_R_16F;
    case GemmType::E4M3: return CUDA_R_8F_E4M3;
    case GemmType::E5M2: return CUDA_R_8F_E5M2;
  }
  return CUDA_R_32F;
}
bool is_fp8(GemmType t) { return t == GemmType::E4M3 || t == GemmType::E5M2; }
const char* type_name(GemmType t) {
  switch (t) {
    case GemmType::F32: return "f32";
    case GemmType::BF16: return "bf16";
    case GemmType::F16: return "f16";
    case GemmType::E4M3: return "e4m3";
    case GemmType::E5M2: return "e5m2";
  }
  return "?";
}

const char* scale_mode_name(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::None:
    case ScaleMode::Tensor: return "per tensor";
    case ScaleMode::Vec128: return "1x128 runs";
    case ScaleMode::Block128x128: return "128x128 tiles";
  }
  return "?";
}

// An FP8 operand without a block mode has one scale (cuBLASLt's scalar mode).
bool per_tensor(ScaleMode mode) { return mode == ScaleMode::None || mode == ScaleMode::Tensor; }

cublasLtMatmulMatrixScale_t lt_scale_mode(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScaleMode::Block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

// The largest power of two up to 256 dividing the address (cuBLASLt picks kernels by it).
int alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && address % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

// Everything an algorithm choice depends on, in cuBLASLt's column-major terms.
using PlanKey =
    std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, int, int, int, int, int, bool, bool, int, int>;

// A matmul descriptor, its layouts and the chosen algorithm, made once per key.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The heuristic's answers, in its order, until the first product times them (LOOM_GEMM_AUTOTUNE).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// One device's handle, plans and workspaces: a workspace per stream the products run on, since
// products queued on two streams may run at once.
struct Context {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  CachingAllocator allocator;
  StreamWorkspaces workspaces{allocator, kWorkspaceBytes};
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  void* workspace(cudaStream_t stream) { return workspaces.get(stream); }
};

Context& context() {
  return current_device_object<Context>("cuBLASLt", [] {
    auto made = std::make_unique<Context>();
    check_lt(cublasLtCreate(&made->handle), "cublasLtCreate");
    return made;
  });
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value, const char* what) {
  check_lt(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value), what);
}

// The operands in cuBLASLt's column-major view: C^T (n x m) = op(b)^T . op(a)^T, so cuBLASLt's
// first operand is b and its second is a.
struct LtProblem {
  int64_t rows, cols, depth;  // cuBLASLt's m (= our n), n (= our m), k
  GemmOperand first, second;
  GemmType out;
  const void* bias = nullptr;  // GemmOutput::bias: one per cuBLASLt row (our column)
  bool fast_accumulation = false;  // GemmOutput::fast_accumulation
  GemmOutput::Epilogue epilogue = GemmOutput::Epilogue::None;  // GemmOutput::epilogue, with its aux
  void* aux = nullptr;
};

// cuBLASLt's epilogue for the bias and GELU a problem asks for.
cublasLtEpilogue_t lt_epilogue(const LtProblem& p) {
  switch (p.epilogue) {
    case GemmOutput::Epilogue::GeluAux:
      return p.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmOutput::Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmOutput::Epilogue::None: break;
  }
  return p.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

std::unique_ptr<Plan> make_plan(Context& ctx, const LtProblem& p, bool accumulate, int alignment) {
  auto plan = std::make_unique<Plan>();
  const bool fp8 = is_fp8(p.first.type);
  check_lt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_first = p.first.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.second.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_first, "set TRANSA");
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_second, "set TRANSB");
  if (fp8) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<int32_t>(lt_scale_mode(p.first.scale_mode)),
        "set A_SCALE_MODE");
    set(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<int32_t>(lt_scale_mode(p.second.scale_mode)),
        "set B_SCALE_MODE");
    // The block modes need the scale pointers set before the heuristic is asked (cuBLASLt: "requires
    // a custom pointer"); every call sets them again to its own.
    set(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.first.scale, "set A_SCALE_POINTER");
    set(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.second.scale, "set B_SCALE_POINTER");
    set(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(p.fast_accumulation ? 1 : 0),
        "set FAST_ACCUM");
  }
  if (p.bias != nullptr || p.epilogue != GemmOutput::Epilogue::None)
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(p), "set EPILOGUE");
  if (p.bias != nullptr) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CUDA_R_16BF), "set BIAS_DATA_TYPE");
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, "set BIAS_POINTER");
  }
  if (p.epilogue != GemmOutput::Epilogue::None) {
    // The GELU input, bf16 like D and laid out as D (cuBLASLt's rows are our columns).
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux, "set EPILOGUE_AUX_POINTER");
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(p.rows), "set EPILOGUE_AUX_LD");
  }
  const uint64_t m = static_cast<uint64_t>(p.rows), n = static_cast<uint64_t>(p.cols), k = static_cast<uint64_t>(p.depth);
  // cuBLASLt A: (m x k) after op; stored k x m when transposed.
  check_lt(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(p.first.type), p.first.transposed ? k : m,
                                      p.first.transposed ? m : k, static_cast<int64_t>(p.first.transposed ? k : m)),
           "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(p.second.type), p.second.transposed ? n : k,
                                      p.second.transposed ? k : n, static_cast<int64_t>(p.second.transposed ? n : k)),
           "layout B");
  // C: with FP8 inputs and an fp32 output, C is fp32 too; otherwise C has D's type.
  check_lt(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(p.out), m, n, static_cast<int64_t>(m)), "layout C");
  check_lt(cublasLtMatrixLayoutCreate(&plan->d, cuda_type(p.out), m, n, static_cast<int64_t>(m)), "layout D");
  cublasLtMatmulPreference_t made = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&made), "cublasLtMatmulPreferenceCreate");
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> preference(
      made, &cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace = kWorkspaceBytes;
  const uint32_t align = static_cast<uint32_t>(alignment);
  check_lt(cublasLtMatmulPreferenceSetAttribute(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof workspace),
           "set MAX_WORKSPACE_BYTES");
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check_lt(cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &align, sizeof align),
             "set MIN_ALIGNMENT");
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(gemm_autotune_candidates()));
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ctx.handle, plan->desc, plan->a, plan->b, plan->c, plan->d, preference.get(),
                                     static_cast<int>(results.size()), results.data(), &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw Error(std::string("cuBLASLt has no algorithm for ") + type_name(p.second.type) + " x " +
                type_name(p.first.type) + " -> " + type_name(p.out) + " with (m, n, k) = (" + std::to_string(p.cols) +
                ", " + std::to_string(p.rows) + ", " + std::to_string(p.depth) + ")" +
                (accumulate ? ", accumulating" : "") + (p.bias != nullptr ? ", with a bf16 bias" : "") +
                (p.epilogue == GemmOutput::Epilogue::GeluAux ? ", GELU and its input out"
                 : p.epilogue == GemmOutput::Epilogue::DGelu ? ", GELU's derivative"
                                                              : "") +
                ", alignment " + std::to_string(alignment) + " bytes: " + cublasLtGetStatusName(status));
  }
  plan->algo = results[0].algo;
  if (found > 1) {
    for (int i = 0; i < found; ++i) plan->candidates.push_back(results[static_cast<size_t>(i)].algo);
  }
  return plan;
}

int element_bytes(GemmType t) {
  switch (t) {
    case GemmType::F32: return 4;
    case GemmType::BF16:
    case GemmType::F16: return 2;
    case GemmType::E4M3:
    case GemmType::E5M2: return 1;
  }
  return 4;
}

// The plan's algorithm: the fastest of its candidates on its first product (gemm_autotune.h),
// into a scratch output; said once per plan on stderr, so a run's log shows what timing bought.
// A GELU_AUX epilogue's candidates write the caller's aux too (the descriptor holds its pointer):
// what the product after them writes again, and aux overlaps no operand (matmul checks).
void tune(Context& ctx, Plan& plan, const LtProblem& p, float alpha, float beta, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(p.rows * p.cols * element_bytes(p.out));
  LtCall call;
  call.handle = ctx.handle;
  call.desc = plan.desc;
  call.a = plan.a, call.b = plan.b, call.c = plan.c, call.d = plan.d;
  call.a_data = p.first.data, call.b_data = p.second.data;
  call.alpha = alpha, call.beta = beta;
  call.scratch = ctx.allocator.allocate(bytes, stream);
  call.workspace = ctx.workspace(stream), call.workspace_bytes = kWorkspaceBytes;
  call.stream = stream;
  const TunedAlgorithm tuned = fastest_algorithm(call, plan.candidates);
  ctx.allocator.release(call.scratch, stream);
  plan.algo = plan.candidates[static_cast<size_t>(tuned.chosen)];
  std::fprintf(stderr,
               "loom: GEMM autotune (m, n, k) = (%lld, %lld, %lld) %s x %s -> %s: the heuristic's first %.1f us, "
               "chose #%d of %d timed, %.1f us\n",
               static_cast<long long>(p.cols), static_cast<long long>(p.rows), static_cast<long long>(p.depth),
               type_name(p.second.type), type_name(p.first.type), type_name(p.out), tuned.first_us, tuned.chosen + 1,
               tuned.timed, tuned.chosen_us);
  plan.candidates.clear();
}

// cuBLASLt's FP8 rules, checked with what is wrong named (before its heuristic answers "no algorithm").
void check_fp8_operands(const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k) {
  LOOM_CHECK(is_fp8(a.type) && is_fp8(b.type) && !(a.type == GemmType::E5M2 && b.type == GemmType::E5M2),
             std::string("matmul: FP8 needs two FP8 operands, not both e5m2; got ") + type_name(a.type) + " and " +
                 type_name(b.type));
  LOOM_CHECK(!a.transposed && b.transposed,
             "matmul: FP8 operands must be a [m, k] and b [n, k] (c = a . b^T), as cuBLASLt requires");
  LOOM_CHECK(m % 16 == 0 && n % 16 == 0 && k % 16 == 0,
             "matmul: FP8 needs m, n, k multiples of 16, got (" + std::to_string(m) + ", " + std::to_string(n) +
                 ", " + std::to_string(k) + ")");
  LOOM_CHECK(a.scale != nullptr && b.scale != nullptr, "matmul: FP8 operands need their scales");
  LOOM_CHECK(reinterpret_cast<uintptr_t>(a.scale) % 16 == 0 && reinterpret_cast<uintptr_t>(b.scale) % 16 == 0,
             "matmul: FP8 scale pointers must be 16-byte aligned (cuBLASLt refuses the product otherwise)");
  // cuBLASLt multiplies per-tensor scales together and block scales together (1x128 runs with
  // runs or with 128x128 tiles), not tiles with tiles.
  const bool a_tensor = per_tensor(a.scale_mode), b_tensor = per_tensor(b.scale_mode);
  const bool tiles_with_tiles =
      a.scale_mode == ScaleMode::Block128x128 && b.scale_mode == ScaleMode::Block128x128;
  LOOM_CHECK(a_tensor == b_tensor && !tiles_with_tiles,
             std::string("matmul: FP8 scale modes ") + scale_mode_name(a.scale_mode) + " and " +
                 scale_mode_name(b.scale_mode) +
                 " cannot be multiplied together (both per tensor, or 1x128 runs with runs or 128x128 tiles)");
}

}  // namespace

void matmul(const GemmOutput& c, const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, int64_t k,
            float alpha, float beta, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  LOOM_CHECK(m > 0 && n > 0 && k >= 0, "matmul: bad shape (" + std::to_string(m) + ", " + std::to_string(n) + ", " +
                                           std::to_string(k) + ")");
  const bool fp8 = is_fp8(a.type) || is_fp8(b.type);
  if (fp8) {
    check_fp8_operands(a, b, m, n, k);
  } else {
    LOOM_CHECK(a.type == b.type, std::string("matmul: operand types differ: ") + type_name(a.type) + " and " +
                                     type_name(b.type));
  }
  LOOM_CHECK(c.bias == nullptr || (c.type == GemmType::BF16 && a.type != GemmType::F32 && per_tensor(a.scale_mode) &&
                                   reinterpret_cast<uintptr_t>(c.bias) % 16 == 0),
             "matmul: a bias is added by the epilogue of a 16-bit or per-tensor FP8 product into a bf16 output, "
             "from a 16-byte aligned bf16 vector");
  if (k == 0) {  // nothing to multiply: c = beta * c
    LOOM_CHECK(c.type == GemmType::F32, "matmul: k = 0 is supported for fp32 outputs only");
    if (beta == 0.0f) {
      check_cuda(cudaMemsetAsync(c.data, 0, static_cast<size_t>(m * n) * sizeof(float), stream), "cudaMemsetAsync");
    } else if (beta != 1.0f) {
      LOOM_CHECK(false, "matmul: k = 0 with beta other than 0 or 1");
    }
    return;
  }
  LOOM_CHECK(!c.fast_accumulation || (fp8 && per_tensor(a.scale_mode) && per_tensor(b.scale_mode)),
             "matmul: fast accumulation is for per-tensor FP8 products only");
  const bool gelu = c.epilogue != GemmOutput::Epilogue::None;
  LOOM_CHECK(!gelu || (c.type == GemmType::BF16 && a.type == GemmType::BF16 && c.aux != nullptr &&
                       reinterpret_cast<uintptr_t>(c.aux) % 16 == 0 && n % 8 == 0 &&
                       (c.bias == nullptr || c.epilogue == GemmOutput::Epilogue::GeluAux)),
             "matmul: GELU in the epilogue is for bf16 operands into a bf16 output, with a 16-byte aligned bf16 "
             "GELU input of n a multiple of 8 columns (n = " + std::to_string(n) + "), a bias only forward");
  if (gelu) {  // aux [m, n] bf16 apart from both operands (a [m, k], b [n, k] in either orientation)
    const auto* aux = static_cast<const uint8_t*>(c.aux);
    const auto apart = [&](const void* x, int64_t count) {
      const auto* p = static_cast<const uint8_t*>(x);
      return aux + m * n * 2 <= p || p + count * 2 <= aux;
    };
    LOOM_CHECK(apart(a.data, m * k) && apart(b.data, n * k), "matmul: a GELU epilogue's aux overlaps an operand");
  }
  const LtProblem p{n, m, k, b, a, c.type, c.bias, c.fast_accumulation, c.epilogue, c.aux};
  // The bias pointer's alignment counts too: the heuristic picks kernels by the pointer the plan's
  // descriptor held when it was made (cublasLt.h), so it has a place of its own in the key.
  const int alignment = std::min({alignment_of(a.data), alignment_of(b.data), alignment_of(c.data)});
  const int bias_alignment = c.bias != nullptr ? alignment_of(c.bias) : 0;
  const bool accumulate = beta != 0.0f;
  const PlanKey key{p.rows,
                    p.cols,
                    p.depth,
                    static_cast<int>(p.first.type),
                    static_cast<int>(p.second.type),
                    static_cast<int>(p.out),
                    p.first.transposed,
                    p.second.transposed,
                    static_cast<int>(p.first.scale_mode),
                    static_cast<int>(p.second.scale_mode),
                    alignment,
                    c.bias != nullptr,
                    bias_alignment,
                    accumulate,
                    c.fast_accumulation,
                    static_cast<int>(c.epilogue),
                    gelu ? alignment_of(c.aux) : 0};
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(key, make_plan(ctx, p, accumulate, alignment)).first;
  Plan& plan = *it->second;
  if (fp8) {
    set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.first.scale, "set A_SCALE_POINTER");
    set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.second.scale, "set B_SCALE_POINTER");
  }
  if (c.bias != nullptr) set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias, "set BIAS_POINTER");
  if (gelu) set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux, "set EPILOGUE_AUX_POINTER");
  if (!plan.candidates.empty()) tune(ctx, plan, p, alpha, beta, stream);
  check_lt(cublasLtMatmul(ctx.handle, plan.desc, &alpha, p.first.data, plan.a, p.second.data, plan.b, &beta, c.data,
                          plan.c, c.data, plan.d, &plan.algo, ctx.workspace(stream), kWorkspaceBytes, stream),
           "cublasLtMatmul");
}

void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
          bool accumulate, cudaStream_t stream) {
  matmul(GemmOutput{c, GemmType::F32}, GemmOperand{a, GemmType::F32, trans_a}, GemmOperand{b, GemmType::F32, trans_b},
         m, n, k, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

void linear_forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features, bool accumulate, cudaStream_t stream) {
  if (n == 0 || out_features == 0) return;
  if (bias != nullptr) broadcast_bias(out, bias, n, out_features, accumulate, stream);
  gemm(out, in, weight, n, out_features, in_features, false, true, bias != nullptr || accumulate, stream);
}

void linear_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features, bool accumulate_din,
                     bool accumulate_dweight, cudaStream_t stream) {
  if (n == 0) return;
  if (din != nullptr) gemm(din, dout, weight, n, in_features, out_features, false, false, accumulate_din, stream);
  if (dweight != nullptr)
    gemm(dweight, dout, in, out_features, in_features, n, true, false, accumulate_dweight, stream);
  if (dbias != nullptr) add_column_sums(dbias, dout, n, out_features, stream);
}

void mxfp8_matmul_emulated(const GemmOutput& c, const uint8_t* a_codes, const uint8_t* a_scales,
                           const uint8_t* b_codes, const uint8_t* b_scales, bool e5m2, int64_t m, int64_t n,
                           int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  const Fp8 format = e5m2 ? Fp8::E5M2 : Fp8::E4M3;
  Scratch scratch;  // the operands' copies, for this call (the legacy stream is ordered with it)
  auto* a16 = scratch.of<__nv_bfloat16>(m * k);
  auto* b16 = scratch.of<__nv_bfloat16>(n * k);
  decode_mx_bf16(a_codes, a_scales, m, k, format, a16, stream);
  decode_mx_bf16(b_codes, b_scales, n, k, format, b16, stream);
  matmul(c, GemmOperand{a16, GemmType::BF16, false}, GemmOperand{b16, GemmType::BF16, true}, m, n, k, 1.0f, 0.0f,
         stream);
}

}  // namespace loom::kernels::cuda
