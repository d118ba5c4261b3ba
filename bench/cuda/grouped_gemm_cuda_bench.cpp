// An MoE layer's experts' GEMMs in one call (kernels::precision_linear_gemms), as one cuBLAS
// grouped product each (kernels/cuda/grouped_gemm.h) against one cuBLASLt product per expert (the
// peer: the same call with grouping off, LOOM_GROUPED_GEMM_ROWS=0's path), at 64 experts of d_model
// 2048 and expert width 1024 with 32 to 2048 rows per expert on average (each expert's rows drawn
// between half and one and a half times that): the forward into bf16 (the up projections') and into
// fp32 rounded to bf16 (the down projections'), the dgrad into bf16 and the wgrad added into fp32
// gradients (one by one both ways where cuBLAS refuses grouped fp32 outputs: the line says so).
// Each is timed as a training step runs it, calls queued back to back: mean ms of 20 calls after 3
// warm-ups, by CUDA events, so a host slower than the GPU shows as the GPU waiting. Where grouping wins, and up to what rows, sets grouped_gemm_most_rows' default.
// One line per shape:
//   GROUPED|<pass>[ into fp32]|E<experts> rows<mean> <in>x<out>|<one by one ms>|<grouped ms>|<ratio>
// Usage: loom_bench_grouped_gemm_cuda
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/grouped_gemm.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/precision_gemm.h"

namespace {

using loom::Device;
using loom::bench::time_ms;
using loom::kernels::CastStore;
using loom::kernels::LinearGemm;
using loom::kernels::OperandCast;
using loom::kernels::PrecisionGemm;
using loom::kernels::cuda::check_cuda;

constexpr int kExperts = 64;
constexpr int64_t kIn = 2048, kOut = 1024;
const Device kGpu = Device::cuda(0);

void* device_bytes(int64_t n) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, static_cast<size_t>(n)), "cudaMalloc");
  check_cuda(cudaMemset(p, 0x3c, static_cast<size_t>(n)), "cudaMemset");  // bf16 1.1e-2 patterns, fp32 0.011
  return p;
}

const char* pass_name(LinearGemm pass) {
  switch (pass) {
    case LinearGemm::Forward: return "forward";
    case LinearGemm::DataGrad: return "dgrad";
    case LinearGemm::WeightGrad: return "wgrad";
  }
  return "?";
}

void run_shape(int64_t mean_rows, void* weights, void* grads) {
  std::mt19937 random(static_cast<uint32_t>(mean_rows));
  std::uniform_int_distribution<int64_t> draw(mean_rows / 2, mean_rows * 3 / 2);
  std::vector<int64_t> rows(kExperts);
  int64_t total = 0;
  for (int64_t& r : rows) total += r = std::max<int64_t>(1, draw(random));
  auto* in16 = static_cast<uint16_t*>(device_bytes(total * kIn * 2));
  auto* dout16 = static_cast<uint16_t*>(device_bytes(total * kOut * 2));
  auto* out16 = static_cast<uint16_t*>(device_bytes(total * std::max(kIn, kOut) * 2));
  auto* out32 = static_cast<float*>(device_bytes(total * kOut * 4));
  struct Case {
    LinearGemm pass;
    bool rounded_fp32;  // a forward's fp32 output rounded to bf16 (the down projections')
  };
  for (const Case c : {Case{LinearGemm::Forward, false}, Case{LinearGemm::Forward, true},
                       Case{LinearGemm::DataGrad, false}, Case{LinearGemm::WeightGrad, false}}) {
    const LinearGemm pass = c.pass;
    std::vector<PrecisionGemm> gemms;
    int64_t at = 0;
    for (int e = 0; e < kExperts; ++e) {
      PrecisionGemm g;
      g.pass = pass;
      g.a.cast = g.b.cast = OperandCast::Bf16;
      g.n = rows[e];
      g.in_features = kIn;
      g.out_features = kOut;
      g.a16 = pass == LinearGemm::Forward ? in16 + at * kIn : dout16 + at * kOut;
      if (pass == LinearGemm::WeightGrad) {
        g.b16 = in16 + at * kIn;
        g.out = static_cast<float*>(grads) + e * kOut * kIn;
        g.accumulate = true;
        g.rounding = loom::kernels::OutputRounding::None;
      } else {
        g.b_store = static_cast<uint16_t*>(weights) + e * kOut * kIn;
        g.b_store_use = CastStore::Read;
        if (c.rounded_fp32) {
          g.out = out32 + at * kOut;
        } else {
          g.out16 = out16 + at * (pass == LinearGemm::Forward ? kOut : kIn);
        }
      }
      gemms.push_back(g);
      at += rows[e];
    }
    auto call = [&] { loom::kernels::precision_linear_gemms(kGpu, gemms.data(), kExperts); };
    loom::kernels::cuda::set_grouped_gemm_most_rows(0);
    const double alone_ms = time_ms(call);
    loom::kernels::cuda::set_grouped_gemm_most_rows(int64_t{1} << 20);
    const int64_t grouped_before = loom::kernels::cuda::grouped_gemm_counts().grouped;
    const double grouped_ms = time_ms(call);
    const bool ran_grouped = loom::kernels::cuda::grouped_gemm_counts().grouped > grouped_before;
    loom::kernels::cuda::set_grouped_gemm_most_rows(-1);
    std::printf("GROUPED|%s%s|E%d rows%lld %lldx%lld|%.4f|%.4f|%.2f%s\n", pass_name(pass),
                c.rounded_fp32 ? " into fp32" : "", kExperts,
                static_cast<long long>(mean_rows), static_cast<long long>(kIn), static_cast<long long>(kOut), alone_ms,
                grouped_ms, alone_ms / grouped_ms, ran_grouped ? "" : " (cuBLAS refused: ran one by one)");
    std::fflush(stdout);
  }
  check_cuda(cudaDeviceSynchronize(), "the shape's runs");
  for (void* p : {static_cast<void*>(in16), static_cast<void*>(dout16), static_cast<void*>(out16),
                  static_cast<void*>(out32)})
    cudaFree(p);
}

void run() {
  loom::kernels::cuda::start_backend();
  void* weights = device_bytes(int64_t{kExperts} * kOut * kIn * 2);
  void* grads = device_bytes(int64_t{kExperts} * kOut * kIn * 4);
  for (const int64_t mean_rows : {32, 128, 512, 2048}) run_shape(mean_rows, weights, grads);
  cudaFree(weights);
  cudaFree(grads);
}

}  // namespace

int main() { return loom::bench::gpu_main("loom_bench_grouped_gemm_cuda", "grouped gemm", run); }
