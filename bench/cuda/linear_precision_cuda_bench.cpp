// One linear layer's forward + dgrad + wgrad on the GPU in every precision recipe
// (model::LinearPrecision on Device::cuda(0), docs/cuda.md), casts and amax read-backs included,
// at a ~1B Llama-style model's MLP shapes with 8192 tokens per step: gate_up 2048 -> 16384 and
// down 8192 -> 2048. fp32 is the plain fp32 linear layer (cuBLASLt, no TF32), the others go
// through the recipe's device path. Random data; mean of 10 timed layer steps after 2 warm-ups.
// FLOP/s count the three GEMMs, 3 x 2 n in out. Each recipe's "cached weights" row is the same
// layer with its weight casts kept across the timed steps (as a training step keeps them across
// its micro-batches): what the cache saves is the difference to the row above it. Under per-tensor
// FP8 a third row also keeps the input's codes from the forward for wgrad, as the model does.
// Usage: loom_bench_linear_precision_cuda
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/ops.h"
#include "loom/model/linear_precision.h"

namespace {

using loom::Device;
using loom::bench::print_result;
using loom::bench::random_device_floats;
using loom::bench::time_ms;
using loom::kernels::cuda::check_cuda;
using loom::model::LinearPrecision;
using loom::model::Recipe;

struct Shape {
  const char* name;
  int64_t n, in, out;
};

void bench_shape(const Shape& s) {
  const Device gpu = Device::cuda(0);
  const std::string shape = std::string(s.name) + " " + std::to_string(s.n) + "x" + std::to_string(s.in) + "->" +
                            std::to_string(s.out);
  const double flops = 3.0 * 2.0 * static_cast<double>(s.n) * static_cast<double>(s.in) * static_cast<double>(s.out);
  // Inputs of unit range, weights and output gradients smaller, as in training.
  float* x = random_device_floats(s.n * s.in, 1);
  float* w = random_device_floats(s.out * s.in, 2);
  float* dy = random_device_floats(s.n * s.out, 3);
  loom::kernels::scale_in_place(gpu, w, s.out * s.in, 0.02f);
  loom::kernels::scale_in_place(gpu, dy, s.n * s.out, 1e-4f);
  float *y = nullptr, *dx = nullptr, *dw = nullptr;
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&y), static_cast<size_t>(s.n * s.out) * 4), "cudaMalloc");
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&dx), static_cast<size_t>(s.n * s.in) * 4), "cudaMalloc");
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&dw), static_cast<size_t>(s.out * s.in) * 4), "cudaMalloc");
  check_cuda(cudaMemset(dx, 0, static_cast<size_t>(s.n * s.in) * 4), "cudaMemset");
  check_cuda(cudaMemset(dw, 0, static_cast<size_t>(s.out * s.in) * 4), "cudaMemset");
  auto run = [&](const std::string& recipe, const std::function<void()>& step) {
    try {
      print_result("loom", "linear layer " + recipe, shape, time_ms(step, 2, 10), flops);
    } catch (const loom::Error& e) {
      std::printf("SKIP|loom|linear layer %s|%s|%s\n", recipe.c_str(), shape.c_str(), e.what());
    }
  };
  run("fp32", [&] {
    loom::kernels::linear_forward(gpu, y, x, w, nullptr, s.n, s.in, s.out);
    loom::kernels::linear_backward(gpu, dx, dw, nullptr, dy, x, w, s.n, s.in, s.out);
  });
  for (Recipe r : {Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Delayed, Recipe::Fp8Current, Recipe::Fp8Blockwise,
                   Recipe::Mxfp8}) {
    LinearPrecision layer(r);
    layer.set_device(gpu);
    run(loom::model::recipe_name(r), [&] {
      layer.forward(y, x, w, nullptr, s.n, s.in, s.out);
      layer.backward(dx, dw, nullptr, dy, x, w, s.n, s.in, s.out);
    });
    // The micro-batches of a training step after its first: the weight's casts made once, kept
    // in the weight cast cache (model/weight_cast_cache.h) and multiplied as they are.
    auto scratch = std::make_shared<loom::model::PrecisionScratch>();
    LinearPrecision cached(r, 16, 0, scratch);
    cached.set_device(gpu);
    scratch->weight_casts.open();
    run(loom::model::recipe_name(r) + " cached weights", [&] {
      cached.forward(y, x, w, nullptr, s.n, s.in, s.out);
      cached.backward(dx, dw, nullptr, dy, x, w, s.n, s.in, s.out);
    });
    // Per-tensor FP8 as the model runs it: the input cast once for the forward and wgrad too
    // (DeviceTensors' keep / kept_input_codes).
    if (cached.keeps_input_codes()) {
      void* codes = nullptr;
      check_cuda(cudaMalloc(&codes, static_cast<size_t>(cached.kept_input_bytes(s.n, s.in))), "cudaMalloc");
      run(loom::model::recipe_name(r) + " cached weights, kept input codes", [&] {
        cached.forward(y, x, w, nullptr, s.n, s.in, s.out, false, loom::model::GemmOutput::Rounded,
                       loom::model::DeviceTensors{.keep_input_codes = codes});
        cached.backward(dx, dw, nullptr, dy, x, w, s.n, s.in, s.out, loom::model::GemmOutput::Rounded, true,
                        loom::model::DeviceTensors{.kept_input_codes = codes});
      });
      cudaFree(codes);
    }
    scratch->weight_casts.close();
  }
  for (float* p : {x, w, dy, y, dx, dw}) cudaFree(p);
}

}  // namespace

int main() {
  return loom::bench::gpu_main("loom_bench_linear_precision_cuda", "linear", [] {
    loom::kernels::cuda::start_backend();
    for (const Shape& s : {Shape{"llama1b.gate_up", 8192, 2048, 16384}, Shape{"llama1b.down", 8192, 8192, 2048}})
      bench_shape(s);
  });
}
