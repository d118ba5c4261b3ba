#include "emulated_precision.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emulated_cuda.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/precision/formats.h"
#include "loom/precision/fp8_scaling.h"
#include "loom/precision/mx.h"

namespace loom::testing {

namespace {

namespace p = loom::precision;
using kernels::CastOperand;
using kernels::OperandCast;
using kernels::OutputRounding;

constexpr Device kHost = Device::cpu();

// The host address behind a device pointer argument; host memory is an Error naming it.
template <typename T>
T* host(T* ptr, const char* op, const char* what) {
  if (ptr == nullptr) return ptr;
  LOOM_CHECK(is_emulated_device_pointer(ptr),
             std::string("emulated cuda: kernels::") + op + "'s " + what + " is host memory, not the device's");
  return emulated_host_view(ptr);
}

void check_device(Device device, const char* op) {
  LOOM_CHECK(device.is_cuda(), std::string("emulated cuda: kernels::") + op + " asked to run on " + device.name());
}

std::vector<float> transposed(const std::vector<float>& in, int64_t rows, int64_t cols) {
  std::vector<float> out(in.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
  return out;
}

bool is_fp8(OperandCast c) {
  return c == OperandCast::Fp8Tensor || c == OperandCast::Fp8Blocks || c == OperandCast::Fp8Tiles;
}

void round_values(float* x, int64_t n, OutputRounding rounding) {
  if (rounding == OutputRounding::Bf16) p::round_to_bf16(x, n);
  if (rounding == OutputRounding::Fp16) p::round_to_fp16(x, n);
}

// Operand `c` [rows, cols] as the GEMM multiplies it, in fp32; `columns`: the GEMM reduces down
// its columns, so its blocks run there (as LinearPrecision::prepare orients them per pass).
// `given`: the operand's values when the caller handed them over otherwise (a bf16 tensor, widened).
std::vector<float> cast_values(const CastOperand& c, int64_t rows, int64_t cols, bool columns,
                               const std::vector<float>* given = nullptr) {
  const int64_t n = rows * cols;
  std::vector<float> v;
  if (given != nullptr) {
    v = *given;
  } else {
    const float* x = host(c.data, "precision_linear_gemm", "operand");
    v.assign(x, x + n);
  }
  if (c.amax_out != nullptr) {  // fp8_delayed: the cast takes the amax of what it reads
    LOOM_CHECK(c.cast == OperandCast::Fp8Tensor && c.amax == nullptr,
               "emulated cuda: precision_linear_gemm takes an amax in the cast (amax_out) only of a per-tensor FP8 "
               "operand whose scale is given");
    kernels::amax_into(kHost, host(c.amax_out, "precision_linear_gemm", "amax_out"), v.data(), n);
  }
  if (is_fp8(c.cast)) {
    for (float& e : v) e = std::isfinite(e) ? e : NAN;
  }
  switch (c.cast) {
    case OperandCast::None: break;
    case OperandCast::Bf16: round_values(v.data(), n, OutputRounding::Bf16); break;
    case OperandCast::Fp16: round_values(v.data(), n, OutputRounding::Fp16); break;
    case OperandCast::Fp8Tensor: {
      const p::Fp8Format f = c.e5m2 ? p::Fp8Format::E5M2 : p::Fp8Format::E4M3;
      const float* amax = host(c.amax, "precision_linear_gemm", "amax");
      const float scale = amax ? p::compute_scale(*amax, p::max_finite(f), c.margin, 1.0f) : c.scale;
      p::quantize_dequantize_fp8(v.data(), n, f, scale);
      break;
    }
    case OperandCast::Fp8Blocks:
      if (columns) {
        std::vector<float> t = transposed(v, rows, cols);
        p::quantize_dequantize_rowwise_blocks(t.data(), cols, rows, p::Fp8Format::E4M3);
        v = transposed(t, cols, rows);
      } else {
        p::quantize_dequantize_rowwise_blocks(v.data(), rows, cols, p::Fp8Format::E4M3);
      }
      break;
    case OperandCast::Fp8Tiles: p::quantize_dequantize_tile_blocks(v.data(), rows, cols, p::Fp8Format::E4M3); break;
    case OperandCast::Mxfp8:
      if (columns) {
        p::quantize_dequantize_mx_columns(v.data(), rows, cols, p::Fp8Format::E4M3);
      } else {
        p::quantize_dequantize_mx(v.data(), rows, cols, p::Fp8Format::E4M3);
      }
      break;
  }
  return v;
}

// What each store holds: the weight's values as the GEMM that wrote it multiplied them.
struct Kept {
  std::vector<float> values;
  kernels::OperandCast cast;
  int64_t rows, cols;
  bool columns;
  bool optimizer = false;  // written by the optimizer's pass (emulated_keep_optimizer_codes) under `scale`
  float scale = 1.0f;
};
std::mutex stores_mutex;
std::map<const void*, Kept> stores;
std::atomic<int64_t> weight_casts{0}, weight_reuses{0}, output_grad_reuses{0}, input_code_reuses{0};

// What the store at `store` (PrecisionGemm's `name`) holds, written by an earlier GEMM of `what`.
Kept kept(const void* store, const char* name, const std::string& what) {
  const std::lock_guard<std::mutex> lock(stores_mutex);
  const auto it = stores.find(host(store, "precision_linear_gemm", name));
  LOOM_CHECK(it != stores.end(), "emulated cuda: precision_linear_gemm reads a " + what + " store never written");
  return it->second;
}
void keep(void* store, const char* name, Kept values) {
  const std::lock_guard<std::mutex> lock(stores_mutex);
  stores[host(store, "precision_linear_gemm", name)] = std::move(values);
}

bool sixteen_bit(OperandCast c) { return c == OperandCast::Bf16 || c == OperandCast::Fp16; }

// A weight's 16-bit store [rows, cols] read as a GPU reads it: its bytes in device memory (written
// by the GEMM that cast it, or the optimizer's bf16 copy of the parameters), which must hold the
// weight's values now (g.b.data) as that cast rounds them: a copy not written since the weight
// changed is an Error.
std::vector<float> sixteen_bit_store(const kernels::PrecisionGemm& g, int64_t rows, int64_t cols) {
  const DType type = g.b.cast == OperandCast::Bf16 ? DType::BF16 : DType::F16;
  const auto* stored = static_cast<const uint16_t*>(host(g.b_store, "precision_linear_gemm", "b_store"));
  std::vector<uint16_t> now(static_cast<size_t>(rows * cols));
  kernels::narrow_floats(kHost, now.data(), cast_values(g.b, rows, cols, false).data(), rows * cols, type);
  LOOM_CHECK(std::memcmp(stored, now.data(), now.size() * sizeof(uint16_t)) == 0,
             "emulated cuda: precision_linear_gemm reads a 16-bit weight store that does not hold its weight's "
             "values now (a stale copy)");
  std::vector<float> v(now.size());
  kernels::widen_floats(kHost, v.data(), stored, rows * cols, type, false);
  return v;
}

// Operand b of a forward or dgrad GEMM (the weight [out, in]): cast now, written to its store,
// or read from it.
std::vector<float> weight_values(const kernels::PrecisionGemm& g, bool columns) {
  const int64_t rows = g.out_features, cols = g.in_features;
  if (g.b_store_use == kernels::CastStore::Read && sixteen_bit(g.b.cast)) {
    ++weight_reuses;
    return sixteen_bit_store(g, rows, cols);
  }
  if (g.b_store_use == kernels::CastStore::Read) {
    ++weight_reuses;
    Kept k = kept(g.b_store, "b_store", "weight");
    // A 16-bit copy is cast element by element: forward's serves dgrad (as on a GPU).
    const bool elementwise = k.cast == OperandCast::Bf16 || k.cast == OperandCast::Fp16;
    LOOM_CHECK(k.cast == g.b.cast && k.rows == rows && k.cols == cols && (k.columns == columns || elementwise),
               "emulated cuda: precision_linear_gemm reads a weight store written for another cast or shape");
    if (k.optimizer) {  // the optimizer's codes must hold the weight's values now, under their scale
      CastOperand now = g.b;
      now.scale = k.scale;
      now.amax = nullptr;
      now.amax_out = nullptr;
      const std::vector<float> expected = cast_values(now, rows, cols, columns);
      LOOM_CHECK(k.scale == g.b.scale && std::memcmp(expected.data(), k.values.data(), expected.size() * 4) == 0,
                 "emulated cuda: precision_linear_gemm reads the optimizer's FP8 codes of a weight that changed "
                 "since, or under another scale (a stale store)");
    }
    return std::move(k.values);
  }
  ++weight_casts;
  std::vector<float> v = cast_values(g.b, rows, cols, columns);
  if (g.b_store_use == kernels::CastStore::Write && sixteen_bit(g.b.cast)) {  // its bytes, as a GPU writes them
    kernels::narrow_floats(kHost, host(g.b_store, "precision_linear_gemm", "b_store"), v.data(), rows * cols,
                           g.b.cast == OperandCast::Bf16 ? DType::BF16 : DType::F16);
  } else if (g.b_store_use == kernels::CastStore::Write) {
    LOOM_CHECK(g.b.cast != OperandCast::None, "emulated cuda: a weight store needs a cast");
    keep(g.b_store, "b_store", Kept{v, g.b.cast, rows, cols, columns});
  }
  if (g.b_store_transposed != nullptr) {  // dgrad's form from the same cast: per-tensor codes are elementwise
    LOOM_CHECK(g.b.cast == OperandCast::Fp8Tensor && g.pass == kernels::LinearGemm::Forward &&
                   g.b_store_use == kernels::CastStore::Write,
               "emulated cuda: precision_linear_gemm writes a weight's transposed codes only from a per-tensor FP8 "
               "forward writing its store");
    keep(g.b_store_transposed, "b_store_transposed", Kept{v, g.b.cast, rows, cols, true});
  }
  return v;
}

// A bf16 operand the caller handed over (PrecisionGemm::a16 / b16): its bytes in device memory,
// widened (exact). Both casts must be Bf16, as on a GPU.
std::vector<float> given_bf16(const kernels::PrecisionGemm& g, const void* x16, int64_t n, const char* name) {
  LOOM_CHECK(g.a.cast == OperandCast::Bf16 && g.b.cast == OperandCast::Bf16,
             std::string("emulated cuda: precision_linear_gemm's ") + name + " (a bf16 operand) needs both casts bf16");
  std::vector<float> v(static_cast<size_t>(n));
  kernels::widen_floats(kHost, v.data(), host(x16, "precision_linear_gemm", name), n, DType::BF16, false);
  return v;
}

// Operand a [rows, cols] of a forward or dgrad given as codes its producer wrote (PrecisionGemm::a_codes,
// emulated_activation_forward_codes / _backward_codes).
std::vector<float> produced_values(const kernels::PrecisionGemm& g, int64_t rows, int64_t cols) {
  LOOM_CHECK(g.a.cast == OperandCast::Fp8Tensor && g.b.cast == OperandCast::Fp8Tensor &&
                 g.pass != kernels::LinearGemm::WeightGrad && g.a16 == nullptr,
             "emulated cuda: precision_linear_gemm takes a's codes (a_codes) in a per-tensor FP8 forward or dgrad");
  const Kept k = kept(g.a_codes, "a_codes", "produced-codes");
  LOOM_CHECK(k.cast == OperandCast::Fp8Tensor && k.rows == rows && k.cols == cols && !k.columns,
             "emulated cuda: precision_linear_gemm reads produced codes written for another shape");
  return k.values;
}

// Operand a (the output gradient [n, OC]) of a dgrad or wgrad GEMM: cast now (and kept in its
// store by dgrad), read from the store dgrad wrote (wgrad), or the bf16 copy the caller made (a16).
std::vector<float> output_grad_values(const kernels::PrecisionGemm& g, bool columns) {
  const int64_t rows = g.n, cols = g.out_features;
  const bool kept_kind = (g.a.cast == OperandCast::Bf16 || g.a.cast == OperandCast::Fp16 ||
                         g.a.cast == OperandCast::Fp8Tensor) &&
                        g.a.cast == g.b.cast;
  LOOM_CHECK(g.a_store_use == kernels::CastStore::None ||
                 (kept_kind && (g.a_store_use == kernels::CastStore::Write ? g.pass == kernels::LinearGemm::DataGrad
                                                                           : g.pass == kernels::LinearGemm::WeightGrad)),
             "emulated cuda: precision_linear_gemm keeps only a 16-bit or per-tensor FP8 output gradient (dgrad "
             "writes, wgrad reads)");
  if (g.a16 != nullptr) {  // handed over: no cast
    LOOM_CHECK(g.a_store_use == kernels::CastStore::None, "emulated cuda: a16 with an output-gradient store");
    ++output_grad_reuses;
    return given_bf16(g, g.a16, rows * cols, "a16");
  }
  if (g.a_codes != nullptr) return produced_values(g, rows, cols);  // cast by the output gradient's producer
  if (g.a_store_use == kernels::CastStore::Read) {
    ++output_grad_reuses;
    const Kept k = kept(g.a_store, "a_store", "output-gradient");
    LOOM_CHECK(k.cast == g.a.cast && k.rows == rows && k.cols == cols,
               "emulated cuda: precision_linear_gemm reads an output-gradient store written for another cast or shape");
    // The store must hold this GEMM's own output gradient (a GPU reads it instead of a.data), when
    // there is one (codes written by the gradient's producer come without it).
    if (g.a.data != nullptr) {
      CastOperand check = g.a;
      check.amax_out = nullptr;  // a GEMM reading a store takes no amax: the one that wrote it did
      const std::vector<float> v = cast_values(check, rows, cols, columns);
      LOOM_CHECK(std::memcmp(k.values.data(), v.data(), v.size() * sizeof(float)) == 0,  // NaN too
                 "emulated cuda: precision_linear_gemm reads an output-gradient store written from "
                 "other values than its output gradient (a stale store)");
    }
    return k.values;
  }
  std::vector<float> v = cast_values(g.a, rows, cols, columns);  // cast element by element
  if (g.a_store_use == kernels::CastStore::Write) keep(g.a_store, "a_store", Kept{v, g.a.cast, rows, cols, columns});
  return v;
}

// The forward's input [n, IC] (a) under per-tensor FP8, kept for the weight gradient when its
// input_codes are written: what the kept codes hold, and the fp32 input they were cast from.
struct KeptInput {
  std::vector<float> values, source;
};
std::map<const void*, KeptInput> kept_inputs;

// Under per-tensor FP8 the input may come in bf16 (a16, its codes kept): cast from its widened values.
std::vector<float> forward_input_values(const kernels::PrecisionGemm& g) {
  const int64_t rows = g.n, cols = g.in_features;
  if (g.a_codes != nullptr) {  // cast by the input's producer, its transposed codes kept already
    LOOM_CHECK(g.input_codes_use == kernels::CastStore::None,
               "emulated cuda: precision_linear_gemm writes no input codes from produced ones");
    return produced_values(g, rows, cols);
  }
  const bool fp8 = g.a.cast == OperandCast::Fp8Tensor && g.b.cast == OperandCast::Fp8Tensor;
  if (g.a16 != nullptr && !fp8) return given_bf16(g, g.a16, rows * cols, "a16");
  LOOM_CHECK(g.a16 == nullptr || g.input_codes_use == kernels::CastStore::Write,
             "emulated cuda: precision_linear_gemm casts a bf16 input (a16) to FP8 only keeping its codes");
  std::vector<float> widened;
  if (g.a16 != nullptr) {
    widened.resize(static_cast<size_t>(rows * cols));
    kernels::widen_floats(kHost, widened.data(), host(g.a16, "precision_linear_gemm", "a16"), rows * cols,
                          DType::BF16, false);
  }
  std::vector<float> v = cast_values(g.a, rows, cols, false, g.a16 != nullptr ? &widened : nullptr);
  if (g.input_codes_use == kernels::CastStore::Write) {
    LOOM_CHECK(fp8, "emulated cuda: precision_linear_gemm keeps an input's codes under per-tensor FP8 only");
    if (g.a16 == nullptr) {
      const float* x = host(g.a.data, "precision_linear_gemm", "operand");
      widened.assign(x, x + rows * cols);
    }
    const std::lock_guard<std::mutex> lock(stores_mutex);
    kept_inputs[host(g.input_codes, "precision_linear_gemm", "input_codes")] = KeptInput{v, std::move(widened)};
  }
  return v;
}

// Operand b (the input [n, IC]) of a weight-gradient GEMM: cast now, the bf16 copy the caller
// made (b16), or the codes its forward kept (input_codes Read: no cast, no scale or amax given;
// b.data, when given, must still hold what they were cast from).
std::vector<float> weight_grad_input_values(const kernels::PrecisionGemm& g) {
  const int64_t rows = g.n, cols = g.in_features;
  if (g.b16 != nullptr) return given_bf16(g, g.b16, rows * cols, "b16");
  if (g.input_codes_use != kernels::CastStore::Read) return cast_values(g.b, rows, cols, true);
  LOOM_CHECK(g.a.cast == OperandCast::Fp8Tensor && g.b.cast == OperandCast::Fp8Tensor,
             "emulated cuda: precision_linear_gemm reads an input's codes under per-tensor FP8 only");
  ++input_code_reuses;
  const std::lock_guard<std::mutex> lock(stores_mutex);
  const auto it = kept_inputs.find(host(g.input_codes, "precision_linear_gemm", "input_codes"));
  LOOM_CHECK(it != kept_inputs.end() && static_cast<int64_t>(it->second.values.size()) == rows * cols,
             "emulated cuda: precision_linear_gemm reads input codes never written for this shape");
  if (g.b.data != nullptr) {
    const float* x = host(g.b.data, "precision_linear_gemm", "operand");
    LOOM_CHECK(std::memcmp(it->second.source.data(), x, it->second.source.size() * sizeof(float)) == 0,
               "emulated cuda: precision_linear_gemm reads input codes cast from other values than its input (a "
               "stale store)");
  }
  return it->second.values;
}

}  // namespace

int64_t emulated_output_grad_reuses() { return output_grad_reuses.load(); }
int64_t emulated_input_code_reuses() { return input_code_reuses.load(); }

void emulated_keep_optimizer_codes(const kernels::AdamWFp8Weight& weight, const float* values) {
  CastOperand cast;
  cast.cast = OperandCast::Fp8Tensor;
  cast.scale = weight.scale;
  const int64_t n = weight.rows * weight.cols;
  std::vector<float> v(values, values + n);
  const std::vector<float> codes = cast_values(cast, weight.rows, weight.cols, false, &v);
  Kept forward{codes, OperandCast::Fp8Tensor, weight.rows, weight.cols, false, true, weight.scale};
  Kept transposed = forward;
  transposed.columns = true;
  keep(weight.forward, "b_store", std::move(forward));
  keep(weight.transposed, "b_store_transposed", std::move(transposed));
}

WeightCastCounts emulated_weight_cast_counts() { return {weight_casts.load(), weight_reuses.load()}; }

void reset_emulated_weight_cast_counts() {
  weight_casts = 0;
  weight_reuses = 0;
}

float emulated_amax(Device device, const float* x, int64_t n) {
  check_device(device, "amax");
  return p::amax(host(x, "amax", "x"), n);
}

namespace {
// What an activation's codes entry writes: `values` (the fp32 activation or its gradient, [rows,
// cols]) cast as `cast` says, kept by the codes' address for the GEMM that takes them (a_codes) and
// by the transposed codes' for the weight gradient (an input's codes, or an output gradient's store).
void keep_produced(const char* op, std::vector<float> values, int64_t rows, int64_t cols, const CastOperand& cast,
                   void* codes, void* transposed, bool input) {
  LOOM_CHECK(cast.cast == OperandCast::Fp8Tensor && codes != nullptr && transposed != nullptr,
             std::string("emulated cuda: kernels::") + op + " writes per-tensor FP8 codes in both orientations");
  std::vector<float> q = cast_values(cast, rows, cols, false, &values);
  const std::lock_guard<std::mutex> lock(stores_mutex);
  stores[host(codes, op, "codes")] = Kept{q, OperandCast::Fp8Tensor, rows, cols, false};
  if (input) {
    kept_inputs[host(transposed, op, "transposed")] = KeptInput{std::move(q), {}};
  } else {
    stores[host(transposed, op, "transposed")] = Kept{std::move(q), OperandCast::Fp8Tensor, rows, cols, true};
  }
}
}  // namespace

void emulated_activation_forward_codes(Device device, kernels::MlpActivation activation, const void* in16,
                                       int64_t rows, int64_t width, const CastOperand& cast, void* codes,
                                       void* transposed) {
  check_device(device, "activation_forward_codes");
  std::vector<float> act(static_cast<size_t>(rows * width));
  kernels::activation_forward_bf16(kHost, activation, act.data(), nullptr,
                                   host(in16, "activation_forward_codes", "in16"), rows, width);
  keep_produced("activation_forward_codes", std::move(act), rows, width, cast, codes, transposed, true);
}

void emulated_activation_backward_codes(Device device, kernels::MlpActivation activation, const void* dout16,
                                        const void* in16, int64_t rows, int64_t width, const CastOperand& cast,
                                        void* codes, void* transposed) {
  check_device(device, "activation_backward_codes");
  const int64_t cols = activation == kernels::MlpActivation::Swiglu ? 2 * width : width;
  std::vector<float> grad(static_cast<size_t>(rows * cols));
  kernels::activation_backward_bf16(kHost, activation, grad.data(), nullptr, nullptr,
                                    host(dout16, "activation_backward_codes", "dout16"),
                                    host(in16, "activation_backward_codes", "in16"), rows, width);
  keep_produced("activation_backward_codes", std::move(grad), rows, cols, cast, codes, transposed, false);
}

namespace {
// The norm's fp32 output [rows, dim] as the CPU's forward computes it, its statistics into mean
// (LayerNorm; null: RMSNorm) and rstd.
std::vector<float> norm_output(const char* op, float* mean, float* rstd, const float* in, const float* weight,
                               const float* bias, int64_t rows, int64_t dim, float eps) {
  std::vector<float> out(static_cast<size_t>(rows * dim));
  if (mean != nullptr) {
    kernels::layernorm_forward(kHost, out.data(), mean, rstd, host(in, op, "in"), host(weight, op, "weight"),
                               host(bias, op, "bias"), rows, dim, eps);
  } else {
    kernels::rmsnorm_forward(kHost, out.data(), rstd, host(in, op, "in"), host(weight, op, "weight"), rows, dim, eps);
  }
  return out;
}

// The epsilon norm_statistics saw for the statistics at `rstd`, for norm_forward_codes to
// recompute the same outputs (a GPU evaluates them from the statistics; the CPU's forward computes
// both together, with the same bits).
std::map<const float*, float> norm_eps;
}  // namespace

void emulated_norm_statistics(Device device, float* mean, float* rstd, const float* in, const float* weight,
                              const float* bias, int64_t rows, int64_t dim, float eps, float* amax) {
  check_device(device, "norm_statistics");
  const std::vector<float> out = norm_output("norm_statistics", host(mean, "norm_statistics", "mean"),
                                             host(rstd, "norm_statistics", "rstd"), in, weight, bias, rows, dim, eps);
  if (amax != nullptr) kernels::amax_into(kHost, host(amax, "norm_statistics", "amax"), out.data(), rows * dim);
  const std::lock_guard<std::mutex> lock(stores_mutex);
  norm_eps[rstd] = eps;
}

void emulated_norm_forward_codes(Device device, const float* in, const float* weight, const float* bias,
                                 const float* mean, const float* rstd, int64_t rows, int64_t dim,
                                 const CastOperand& cast, void* codes, void* transposed) {
  check_device(device, "norm_forward_codes");
  const char* op = "norm_forward_codes";
  float eps = 0.0f;
  {
    const std::lock_guard<std::mutex> lock(stores_mutex);
    const auto it = norm_eps.find(rstd);
    LOOM_CHECK(it != norm_eps.end(), "emulated cuda: norm_forward_codes reads statistics norm_statistics never wrote");
    eps = it->second;
  }
  // Recomputed with the statistics: they must be what norm_statistics left for this input.
  std::vector<float> m(mean != nullptr ? static_cast<size_t>(rows) : 0), s(static_cast<size_t>(rows));
  std::vector<float> out = norm_output(op, mean != nullptr ? m.data() : nullptr, s.data(), in, weight, bias, rows, dim, eps);
  LOOM_CHECK(std::memcmp(s.data(), host(rstd, op, "rstd"), s.size() * sizeof(float)) == 0 &&
                 (mean == nullptr || std::memcmp(m.data(), host(mean, op, "mean"), m.size() * sizeof(float)) == 0),
             "emulated cuda: norm_forward_codes is given statistics of another input");
  keep_produced(op, std::move(out), rows, dim, cast, codes, transposed, true);
}

void emulated_round_in_place(Device device, float* x, int64_t n, OutputRounding rounding) {
  check_device(device, "round_in_place");
  round_values(host(x, "round_in_place", "x"), n, rounding);
}

namespace {
// A bf16 bias handed over (PrecisionGemm::bias16: the optimizer's copy) must hold the fp32 bias
// rounded to bf16 as it is now (`rounded`), as the epilogue on a GPU reads it instead.
void check_bias16(const kernels::PrecisionGemm& g, const std::vector<float>& rounded) {
  LOOM_CHECK(g.bias != nullptr && g.rounding == OutputRounding::Bf16,
             "emulated cuda: precision_linear_gemm takes a bf16 bias with its fp32 bias under a bf16 rounding");
  std::vector<uint16_t> want(rounded.size());
  kernels::narrow_floats(kHost, want.data(), rounded.data(), static_cast<int64_t>(rounded.size()), DType::BF16);
  LOOM_CHECK(std::memcmp(host(g.bias16, "precision_linear_gemm", "bias16"), want.data(), want.size() * 2) == 0,
             "emulated cuda: precision_linear_gemm's bf16 bias does not hold its bias's values now (a stale copy)");
}
// GELU in the epilogue (PrecisionGemm::pre_gelu16, gelu_input16): what the unfused passes compute
// from the product y (rounded to bf16): the forward keeps y as the GELU input and leaves the CPU's
// GELU of it in out16; dgrad leaves the CPU's GELU gradient at the kept input, with y as the
// activation's gradient, its column sums (over the fp32 gradient) added into gelu_bias_grad.
void gelu_epilogue(const kernels::PrecisionGemm& g, const std::vector<float>& y) {
  const char* op = "precision_linear_gemm";
  const int64_t count = static_cast<int64_t>(y.size());
  const int64_t rows = g.n, width = g.pass == kernels::LinearGemm::Forward ? g.out_features : g.in_features;
  // A GPU's rules too (cuBLASLt's: the GELU input's columns a multiple of 8, 16-byte aligned).
  LOOM_CHECK(g.a.cast == OperandCast::Bf16 && g.b.cast == OperandCast::Bf16 && width % 8 == 0 &&
                 (g.pre_gelu16 == nullptr || g.pass == kernels::LinearGemm::Forward) &&
                 (g.gelu_input16 == nullptr || (g.pass == kernels::LinearGemm::DataGrad && g.bias == nullptr)) &&
                 (g.gelu_bias_grad == nullptr || g.gelu_input16 != nullptr) &&
                 reinterpret_cast<uintptr_t>(g.pre_gelu16 != nullptr ? g.pre_gelu16 : g.gelu_input16) % 16 == 0,
             "emulated cuda: precision_linear_gemm's GELU epilogue is a bf16 forward's (pre_gelu16) or a bf16 "
             "dgrad's (gelu_input16, with the bias gradient gelu_bias_grad), over a 16-byte aligned GELU input "
             "of a multiple of 8 columns");
  if (g.pass == kernels::LinearGemm::Forward) {
    void* pre = host(g.pre_gelu16, op, "pre_gelu16");
    kernels::narrow_floats(kHost, pre, y.data(), count, DType::BF16);
    kernels::activation_forward_bf16(kHost, kernels::MlpActivation::Gelu, nullptr, host(g.out16, op, "out16"), pre,
                                     rows, width);
    return;
  }
  std::vector<uint16_t> dact16(static_cast<size_t>(count));
  kernels::narrow_floats(kHost, dact16.data(), y.data(), count, DType::BF16);
  kernels::activation_backward_bf16(kHost, kernels::MlpActivation::Gelu, nullptr, host(g.out16, op, "out16"),
                                    host(g.gelu_bias_grad, op, "gelu_bias_grad"), dact16.data(),
                                    host(g.gelu_input16, op, "gelu_input16"), rows, width);
}

}  // namespace

void emulated_precision_linear_gemm(Device device, const kernels::PrecisionGemm& g) {
  check_device(device, "precision_linear_gemm");
  LOOM_CHECK(g.b_store_use == kernels::CastStore::None || g.pass != kernels::LinearGemm::WeightGrad,
             "emulated cuda: precision_linear_gemm keeps only a weight (forward, dgrad) in a store");
  LOOM_CHECK(g.a_store_use == kernels::CastStore::None || g.pass != kernels::LinearGemm::Forward,
             "emulated cuda: precision_linear_gemm keeps a forward's input in input_codes, not a_store");
  LOOM_CHECK(g.input_codes_use == kernels::CastStore::None ||
                 g.pass == (g.input_codes_use == kernels::CastStore::Write ? kernels::LinearGemm::Forward
                                                                           : kernels::LinearGemm::WeightGrad),
             "emulated cuda: precision_linear_gemm's input codes are written by a forward and read by a wgrad");
  const int64_t n = g.n, in = g.in_features, out = g.out_features;
  std::vector<float> a, b, y;
  switch (g.pass) {
    case kernels::LinearGemm::Forward: {  // in [n, IC] . W [OC, IC]^T, plus the bias rounded to the output's dtype
      a = forward_input_values(g);
      b = weight_values(g, false);
      y.resize(static_cast<size_t>(n * out));
      std::vector<float> bias;
      if (g.bias != nullptr) {
        const float* given = host(g.bias, "precision_linear_gemm", "bias");
        bias.assign(given, given + out);
        round_values(bias.data(), out, g.rounding);
      }
      if (g.bias16 != nullptr) check_bias16(g, bias);
      kernels::linear_forward(kHost, y.data(), a.data(), b.data(), bias.empty() ? nullptr : bias.data(), n, in, out,
                              false);
      break;
    }
    case kernels::LinearGemm::DataGrad:  // dout [n, OC] . W [OC, IC]
      a = output_grad_values(g, false);
      b = weight_values(g, true);
      y.resize(static_cast<size_t>(n * in));
      kernels::gemm(kHost, y.data(), a.data(), b.data(), n, in, out, false, false, false);
      break;
    case kernels::LinearGemm::WeightGrad:  // dout [n, OC]^T . in [n, IC]
      a = output_grad_values(g, true);
      b = weight_grad_input_values(g);
      y.resize(static_cast<size_t>(out * in));
      kernels::gemm(kHost, y.data(), a.data(), b.data(), out, in, n, true, false, false);
      break;
  }
  round_values(y.data(), static_cast<int64_t>(y.size()), g.rounding);
  LOOM_CHECK(g.b16 == nullptr || g.pass == kernels::LinearGemm::WeightGrad,
             "emulated cuda: precision_linear_gemm takes a bf16 b (b16) only as wgrad's input");
  if (g.out16 != nullptr) {  // the bf16 result itself (y is already rounded to bf16: exact)
    LOOM_CHECK(g.pass != kernels::LinearGemm::WeightGrad && g.rounding == OutputRounding::Bf16 && !g.accumulate &&
                   g.a.cast != OperandCast::None && g.b.cast != OperandCast::None,
               "emulated cuda: precision_linear_gemm leaves a bf16 output only from a forward or dgrad of cast "
               "operands, rounded to bf16, not accumulated");
    if (g.pre_gelu16 != nullptr || g.gelu_input16 != nullptr) {
      gelu_epilogue(g, y);
      return;
    }
    kernels::narrow_floats(kHost, host(g.out16, "precision_linear_gemm", "out16"), y.data(),
                           static_cast<int64_t>(y.size()), DType::BF16);
    return;
  }
  LOOM_CHECK(g.pre_gelu16 == nullptr && g.gelu_input16 == nullptr && g.gelu_bias_grad == nullptr,
             "emulated cuda: precision_linear_gemm applies GELU in its epilogue only into a bf16 output (out16)");
  LOOM_CHECK(g.addend == nullptr || (g.accumulate && g.pass == kernels::LinearGemm::Forward),
             "emulated cuda: precision_linear_gemm adds an addend only in a forward accumulating into its output");
  float* dst = host(g.out, "precision_linear_gemm", "out");
  const float* base = g.addend != nullptr ? host(g.addend, "precision_linear_gemm", "addend") : dst;
  for (size_t i = 0; i < y.size(); ++i) dst[i] = g.accumulate ? base[i] + y[i] : y[i];
}

}  // namespace loom::testing
