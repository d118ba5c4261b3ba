// cuBLASLt products through loom (kernels/cuda/gemm_lt.h) at 4096^3 and at training shapes
// (GPT-2 124M and a ~1B Llama-style model, 8192 tokens per step): bf16, FP8 E4M3 with per-tensor
// scales (with and without fast accumulation), FP8 with 1 x 128 / 128 x 128 block scales (bf16
// outputs), and fp32 at 4096^3. Random
// data; mean of 20 timed products after 3 warm-ups. bench/cuda/torch_cuda_peer.py times
// torch.matmul and torch._scaled_mm on the same shapes. Usage: loom_bench_gemm_cuda
#include <cuda_bf16.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/gemm_lt.h"
#include "loom/kernels/cuda/quantize.h"

namespace {

using namespace loom::kernels::cuda;
using loom::bench::print_result;
using loom::bench::random_device_floats;
using loom::bench::time_ms;

struct Shape {
  const char* name;
  int64_t m, n, k;  // c[m, n] = a[m, k] . b[n, k]^T
};

const std::vector<Shape> kShapes = {
    {"4096^3", 4096, 4096, 4096},          {"gpt2.qkv", 8192, 2304, 768},     {"gpt2.fc", 8192, 3072, 768},
    {"gpt2.proj", 8192, 768, 3072},        {"llama1b.qkv", 8192, 3072, 2048}, {"llama1b.gate_up", 8192, 16384, 2048},
    {"llama1b.down", 8192, 2048, 8192},
};


void bench_shape(const Shape& s) {
  const std::string shape = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
  const double flops = 2.0 * s.m * s.n * s.k;
  float* a = random_device_floats(s.m * s.k, 1);
  float* b = random_device_floats(s.n * s.k, 2);
  __nv_bfloat16 *a16, *b16, *c16;
  uint8_t *a8, *b8;
  float *sa, *sb, *block_sa, *block_sb;
  check_cuda(cudaMalloc(&a16, s.m * s.k * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&b16, s.n * s.k * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&c16, s.m * s.n * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&a8, s.m * s.k), "cudaMalloc");
  check_cuda(cudaMalloc(&b8, s.n * s.k), "cudaMalloc");
  check_cuda(cudaMalloc(&sa, 4), "cudaMalloc");
  check_cuda(cudaMalloc(&sb, 4), "cudaMalloc");
  check_cuda(cudaMalloc(&block_sa, s.m * ((s.k + 127) / 128) * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&block_sb, blockwise_tile_scale_count(s.n, s.k) * 4), "cudaMalloc");
  // The same values in every format: FP8 codes of scale 1, read as bf16 through the MX decoder
  // with unit scales (E8M0 127 = 2^0), which is exact.
  encode_fp8(a, a8, s.m * s.k, Fp8::E4M3, 1.0f);
  encode_fp8(b, b8, s.n * s.k, Fp8::E4M3, 1.0f);
  const float one = 1.0f;
  check_cuda(cudaMemcpy(sa, &one, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(sb, &one, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  const std::vector<uint8_t> scales_a(static_cast<size_t>(s.m * s.k / 32), 127), scales_b(static_cast<size_t>(s.n * s.k / 32), 127);
  uint8_t *mx_a, *mx_b, *block_a, *block_b;
  check_cuda(cudaMalloc(&mx_a, scales_a.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&mx_b, scales_b.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&block_a, s.m * s.k), "cudaMalloc");
  check_cuda(cudaMalloc(&block_b, s.n * s.k), "cudaMalloc");
  check_cuda(cudaMemcpy(mx_a, scales_a.data(), scales_a.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(mx_b, scales_b.data(), scales_b.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  decode_mx_bf16(a8, mx_a, s.m, s.k, Fp8::E4M3, a16);
  decode_mx_bf16(b8, mx_b, s.n, s.k, Fp8::E4M3, b16);
  encode_rowwise_blocks(a, block_a, block_sa, s.m, s.k, Fp8::E4M3);
  encode_tile_blocks(b, block_b, block_sb, s.n, s.k, Fp8::E4M3);
  check_cuda(cudaDeviceSynchronize(), "bench setup");
  const GemmOutput out{c16, GemmType::BF16};
  print_result("loom", "gemm bf16", s.name + std::string(" ") + shape, time_ms([&] {
                 matmul(out, GemmOperand{a16, GemmType::BF16, false}, GemmOperand{b16, GemmType::BF16, true}, s.m, s.n,
                        s.k, 1.0f, 0.0f);
               }),
               flops);
  print_result("loom", "gemm fp8 e4m3 tensor", s.name + std::string(" ") + shape, time_ms([&] {
                 matmul(out, GemmOperand{a8, GemmType::E4M3, false, sa, ScaleMode::Tensor},
                        GemmOperand{b8, GemmType::E4M3, true, sb, ScaleMode::Tensor}, s.m, s.n, s.k, 1.0f, 0.0f);
               }),
               flops);
  // The same product with cuBLASLt's fast accumulation (what per-tensor FP8 forwards use by
  // default: precision.fp8_forward_fast_accumulation); its gain over the row above.
  const GemmOutput fast_out{c16, GemmType::BF16, nullptr, true};
  print_result("loom", "gemm fp8 e4m3 tensor fast-accum", s.name + std::string(" ") + shape, time_ms([&] {
                 matmul(fast_out, GemmOperand{a8, GemmType::E4M3, false, sa, ScaleMode::Tensor},
                        GemmOperand{b8, GemmType::E4M3, true, sb, ScaleMode::Tensor}, s.m, s.n, s.k, 1.0f, 0.0f);
               }),
               flops);
  try {
    print_result("loom", "gemm fp8 e4m3 block128", s.name + std::string(" ") + shape, time_ms([&] {
                   matmul(out, GemmOperand{block_a, GemmType::E4M3, false, block_sa, ScaleMode::Vec128},
                          GemmOperand{block_b, GemmType::E4M3, true, block_sb, ScaleMode::Block128x128}, s.m, s.n, s.k,
                          1.0f, 0.0f);
                 }),
                 flops);
  } catch (const loom::Error& e) {
    std::printf("SKIP|loom|gemm fp8 e4m3 block128|%s|%s\n", shape.c_str(), e.what());
  }
  print_result("loom", "gemm mxfp8 emulated", s.name + std::string(" ") + shape, time_ms([&] {
                 mxfp8_matmul_emulated(out, a8, mx_a, b8, mx_b, false, s.m, s.n, s.k);
               }),
               flops);
  if (s.m == 4096 && s.n == 4096 && s.k == 4096) {
    float* c32 = nullptr;
    check_cuda(cudaMalloc(&c32, s.m * s.n * 4), "cudaMalloc");
    print_result("loom", "gemm fp32", s.name + std::string(" ") + shape,
                 time_ms([&] { gemm(c32, a, b, s.m, s.n, s.k, false, true, false); }), flops);
    cudaFree(c32);
  }
  for (void* p : std::vector<void*>{a, b, a16, b16, c16, a8, b8, sa, sb, block_sa, block_sb, mx_a, mx_b, block_a, block_b}) cudaFree(p);
}

}  // namespace

int main() {
  return loom::bench::gpu_main("loom_bench_gemm_cuda", "gemm", [] {
    for (const Shape& s : kShapes) bench_shape(s);
  });
}
