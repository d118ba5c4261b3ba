// loom's GPU flash attention (kernels/cuda/flash_attention.h), causal forward + backward, fp32 and
// bf16 inputs, at GPT-2 124M's and a ~1B Llama-style model's attention shapes and a long one.
// FLOPs counted as FlashAttention's papers do for causal attention: forward 2 * 2 * B * H * T^2 * D
// halved, backward 2.5 times the forward. bench/cuda/torch_cuda_peer.py times PyTorch's
// scaled_dot_product_attention on the same shapes. bf16 also through cuDNN's fused flash attention
// (cudnn_attention.h; op names end in "via cuDNN"), what the model runs where cuDNN serves; a
// SKIP line says why where it cannot. Usage: loom_bench_flash_attention_cuda
#include <cuda_bf16.h>

#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_util.h"
#include "loom/kernels/cuda/cudnn_attention.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/scratch.h"

namespace {

using namespace loom::kernels::cuda;
using loom::kernels::AttentionVisibility;
using loom::kernels::FlashAttentionShape;

struct Shape {
  const char* name;
  int64_t batch, seq, heads, kv_heads, dim;
};

const std::vector<Shape> kShapes = {
    {"gpt2", 8, 1024, 12, 12, 64}, {"llama1b", 4, 2048, 32, 8, 64}, {"long_d128", 1, 8192, 16, 16, 128}};

template <typename T>
T* device_copy(const float* values, int64_t n);

template <>
float* device_copy<float>(const float* values, int64_t n) {
  float* out = nullptr;
  check_cuda(cudaMalloc(&out, n * 4), "cudaMalloc");
  check_cuda(cudaMemcpy(out, values, n * 4, cudaMemcpyDeviceToDevice), "cudaMemcpy");
  return out;
}
template <>
__nv_bfloat16* device_copy<__nv_bfloat16>(const float* values, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  check_cuda(cudaMemcpy(host.data(), values, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<__nv_bfloat16> converted(host.size());
  for (size_t i = 0; i < host.size(); ++i) converted[i] = __float2bfloat16(host[i]);
  __nv_bfloat16* out = nullptr;
  check_cuda(cudaMalloc(&out, n * 2), "cudaMalloc");
  check_cuda(cudaMemcpy(out, converted.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  return out;
}

// The same calls on cuDNN's fused attention (bf16 only), with workspace from the device's scratch as
// the model takes it.
void bench_cudnn(const std::string& name, const FlashAttentionShape& shape, double forward_flops, __nv_bfloat16* out,
                 float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                 const __nv_bfloat16* dout, float* dq, float* dk, float* dv) {
  std::string why = cudnn_attention_refusal(shape, AttentionVisibility{}, {out, q, k, v, dout});
  if (why.empty()) why = cudnn_attention_prepare(shape, false);
  if (why.empty()) why = cudnn_attention_prepare(shape, true);
  if (!why.empty()) {
    std::printf("SKIP|loom|attention via cuDNN|%s|%s\n", name.c_str(), why.c_str());
    return;
  }
  const auto forward = [&] {
    Scratch scratch;
    cudnn_attention_forward(out, lse, q, k, v, shape, scratch, nullptr);
  };
  const double fwd = loom::bench::time_ms(forward, 2, 5);
  const double both = loom::bench::time_ms(
      [&] {
        forward();
        Scratch scratch;
        cudnn_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, shape, scratch, nullptr);
      },
      1, 3);
  loom::bench::print_result("loom", "attention fwd bf16 via cuDNN", name, fwd, forward_flops);
  loom::bench::print_result("loom", "attention fwd+bwd bf16 via cuDNN", name, both, 3.5 * forward_flops);
}

template <typename T>
void bench(const Shape& s, const char* type) {
  const int64_t q_n = s.batch * s.seq * s.heads * s.dim, kv_n = s.batch * s.seq * s.kv_heads * s.dim;
  const FlashAttentionShape shape{s.batch, s.seq, s.seq, s.heads, s.kv_heads, s.dim, s.heads * s.dim,
                                  s.kv_heads * s.dim, s.kv_heads * s.dim, s.heads * s.dim};
  float* source = loom::bench::random_device_floats(q_n + 2, 7);
  T* q = device_copy<T>(source, q_n);
  T* k = device_copy<T>(source, kv_n);
  T* v = device_copy<T>(source + 1, kv_n);
  T* dout = device_copy<T>(source + 2, q_n);
  T* out = device_copy<T>(source, q_n);
  float *lse, *dq, *dk, *dv;
  check_cuda(cudaMalloc(&lse, s.batch * s.heads * s.seq * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&dq, q_n * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&dk, kv_n * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&dv, kv_n * 4), "cudaMalloc");
  const double forward_flops = 4.0 * s.batch * s.heads * s.seq * s.seq * s.dim / 2.0;
  const std::string name = std::string(s.name) + " B" + std::to_string(s.batch) + " T" + std::to_string(s.seq) + " H" +
                           std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " D" + std::to_string(s.dim);
  const double fwd = loom::bench::time_ms([&] { flash_attention_forward(out, lse, q, k, v, shape, AttentionVisibility{}); }, 2, 5);
  const double both = loom::bench::time_ms(
      [&] {
        flash_attention_forward(out, lse, q, k, v, shape, AttentionVisibility{});
        flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, shape, AttentionVisibility{});
      },
      1, 3);
  loom::bench::print_result("loom", std::string("attention fwd ") + type, name, fwd, forward_flops);
  loom::bench::print_result("loom", std::string("attention fwd+bwd ") + type, name, both, 3.5 * forward_flops);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    bench_cudnn(name, shape, forward_flops, out, lse, q, k, v, dout, dq, dk, dv);
  for (void* p : std::vector<void*>{source, q, k, v, dout, out, lse, dq, dk, dv}) cudaFree(p);
}

}  // namespace

int main() {
  return loom::bench::gpu_main("loom_bench_flash_attention_cuda", "attention", [] {
    for (const Shape& s : kShapes) {
      bench<__nv_bfloat16>(s, "bf16");
      bench<float>(s, "fp32");
    }
  });
}
