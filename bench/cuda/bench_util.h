#pragma once
// Shared pieces of the GPU benchmarks: random device data (never zeros: they run faster than real
// data), timing with CUDA events, and the result line gpu_test.sh turns into its table:
//   RESULT|<implementation>|<operation>|<shape>|<milliseconds>|<TFLOP/s>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "loom/kernels/cuda/device.h"

namespace loom::bench {

// n floats, uniform in [-1, 1), from a xorshift generator seeded by `seed`, on the device.
inline float* random_device_floats(int64_t n, uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : host) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(s >> 40) / static_cast<float>(1ull << 23) - 1.0f;
  }
  float* device = nullptr;
  kernels::cuda::check_cuda(cudaMalloc(reinterpret_cast<void**>(&device), host.size() * sizeof(float)), "cudaMalloc");
  kernels::cuda::check_cuda(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                            "cudaMemcpy");
  return device;
}

// Mean milliseconds of `run` over `iterations` after `warmup` untimed runs.
inline double time_ms(const std::function<void()>& run, int warmup = 3, int iterations = 20) {
  for (int i = 0; i < warmup; ++i) run();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < iterations; ++i) run();
  cudaEventRecord(stop);
  kernels::cuda::check_cuda(cudaEventSynchronize(stop), "timed runs");
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iterations;
}

// A GPU benchmark's main: without a usable GPU one SKIP line for `operation` (exit 0), else
// `run`, whose error is one line on stderr naming `program` (exit 1).
inline int gpu_main(const char* program, const char* operation, const std::function<void()>& run) {
  const kernels::cuda::DeviceStatus& status = kernels::cuda::device_status();
  if (!status.available) {
    std::printf("SKIP|loom|%s|all|no usable GPU: %s\n", operation, status.reason.c_str());
    return 0;
  }
  try {
    run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
  return 0;
}

inline void print_result(const std::string& impl, const std::string& op, const std::string& shape, double ms,
                         double flops) {
  std::printf("RESULT|%s|%s|%s|%.4f|%.1f\n", impl.c_str(), op.c_str(), shape.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}

}  // namespace loom::bench
