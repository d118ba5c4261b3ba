// Mamba-2's chunked scan on the GPU in each of its forms (kernels/cuda/ssd_chunk_scan.h): the
// CPU's block walk per (row, head) in double on CUDA cores (`loops`) and the chunk-parallel form
// on cuBLAS's batched DGEMMs (`chunks`) and in fp32 on TF32 ones (`chunks-tf32`), forward and
// forward + backward, at the mixer shapes of a Nemotron-H-sized
// model (128 heads of 64 channels, state 128 in 8 groups, blocks of 128 tokens) over 4096 and
// 8192 tokens, and of the tiny Super (configs/nemotron3-super-tiny.yaml: 8 heads of 16, state 16
// in 2 groups, blocks of 64; a micro-batch of 8 x 128). TFLOP/s count the planner's scan FLOPs
// (model::ssd_scan_forward_flops_per_token; forward + backward 3x the forward), so they say what
// rate `loom plan time` should give the scan on this GPU. The peer, the same scan as PyTorch
// einsums over blocks (bench/cuda/torch_cuda_peer.py ssd), prints its rows beside these. Random
// inputs; mean ms of 10 runs after 2 warm-ups.
// Usage: loom_bench_ssd_scan_cuda
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "bench_util.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/ssd_chunk_scan.h"
#include "loom/kernels/cuda/ssd_scan.h"
#include "loom/model/flops.h"

namespace {

using loom::bench::print_result;
using loom::bench::random_device_floats;
using loom::bench::time_ms;
using loom::kernels::SsdShape;
using loom::kernels::cuda::check_cuda;

struct ScanCase {
  const char* name;
  int64_t batch, seq, heads, head_dim, groups, state, chunk;
};

float* zeros(int64_t n) {
  float* p = nullptr;
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&p), static_cast<size_t>(n) * sizeof(float)), "cudaMalloc");
  check_cuda(cudaMemset(p, 0, static_cast<size_t>(n) * sizeof(float)), "cudaMemset");
  return p;
}

void run_case(const ScanCase& c) {
  const int64_t rows = c.batch * c.seq, inner = c.heads * c.head_dim, bc = c.groups * c.state;
  const SsdShape s{c.batch, c.seq, c.heads, c.head_dim, c.groups, c.state, c.chunk, inner, c.heads, bc, inner};
  float* x = random_device_floats(rows * inner, 1);
  float* dt_raw = random_device_floats(rows * c.heads, 2);
  float* dt_bias = random_device_floats(c.heads, 3);
  float* a_log = random_device_floats(c.heads, 4);
  float* B = random_device_floats(rows * bc, 5);
  float* C = random_device_floats(rows * bc, 6);
  float* D = random_device_floats(c.heads, 7);
  float* dy = random_device_floats(rows * inner, 8);
  float* y = zeros(rows * inner);
  float* dx = zeros(rows * inner);
  float* ddt = zeros(rows * c.heads);
  float* dB = zeros(rows * bc);
  float* dC = zeros(rows * bc);
  float* per_head = zeros(3 * c.heads);  // d(dt_bias), d(A_log), d(D)
  const double forward_flops = static_cast<double>(rows) * loom::model::ssd_scan_forward_flops_per_token(
                                                               c.heads, c.head_dim, c.groups, c.state, c.chunk, c.seq);
  const std::string shape = std::string(c.name) + " B" + std::to_string(c.batch) + " T" + std::to_string(c.seq) + " H" +
                            std::to_string(c.heads) + " P" + std::to_string(c.head_dim) + " G" +
                            std::to_string(c.groups) + " N" + std::to_string(c.state) + " chunk" +
                            std::to_string(c.chunk);
  using loom::kernels::cuda::SsdScanForm;
  // The chunk-parallel forms first: the stage's time cap may cut the rest.
  for (SsdScanForm form : {SsdScanForm::ChunksTf32, SsdScanForm::Chunks, SsdScanForm::Loops}) {
    loom::kernels::cuda::set_ssd_scan_form(static_cast<int>(form));
    const std::string via = form == SsdScanForm::ChunksTf32 ? " via chunks, batched TF32 GEMMs"
                            : form == SsdScanForm::Chunks   ? " via chunks, batched DGEMMs"
                                                            : " via loops, double";
    const auto forward = [&] {
      loom::kernels::cuda::ssd_scan_forward(y, x, dt_raw, dt_bias, a_log, B, C, D, s, nullptr);
    };
    const double forward_ms = time_ms(forward, 2, 10);
    print_result("loom", "ssd scan fwd" + via, shape, forward_ms, forward_flops);
    const double both_ms = time_ms(
        [&] {
          forward();
          loom::kernels::cuda::ssd_scan_backward(dx, ddt, per_head, per_head + c.heads, dB, dC,
                                                 per_head + 2 * c.heads, dy, x, dt_raw, dt_bias, a_log, B, C, D, s,
                                                 nullptr);
        },
        2, 10);
    print_result("loom", "ssd scan fwd+bwd" + via, shape, both_ms, 3.0 * forward_flops);
    check_cuda(cudaDeviceSynchronize(), "the scan");
  }
  loom::kernels::cuda::set_ssd_scan_form(0);
  for (float* p : {x, dt_raw, dt_bias, a_log, B, C, D, dy, y, dx, ddt, dB, dC, per_head}) cudaFree(p);
}

void run() {
  for (const ScanCase& c : {ScanCase{"tiny-super", 8, 128, 8, 16, 2, 16, 64},
                            ScanCase{"nemotron-h", 1, 4096, 128, 64, 8, 128, 128},
                            ScanCase{"nemotron-h", 1, 8192, 128, 64, 8, 128, 128}}) {
    run_case(c);
  }
}

}  // namespace

int main() { return loom::bench::gpu_main("loom_bench_ssd_scan_cuda", "ssd scan", run); }
