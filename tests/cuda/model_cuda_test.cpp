// The model and trainer on a real GPU (runtime.device=cuda): the gradient norm's check for Inf or
// NaN against the CPU, transfers through the device's allocator, and the tiny Llama-style model trained 4 steps
// (2 micro-batches each) on Device::cuda(0) and on the CPU: losses within 1e-4 relative (fp32,
// different summation orders in the GEMMs and reductions). Skipped, saying why, without a GPU;
// tests/train/device_training_test.cpp runs the same path on the emulated device everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../train/tiny_super_model.h"
#include "../train/training_runs.h"
#include "cuda_test_util.h"
#include "loom/core/device.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/cudnn_library.h"
#include "loom/kernels/cuda_entries.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cuda {
namespace {

using testing::random_values;

class CudaModel : public testing::GpuTest<> {};

// The precision step skips a step whose gradient norm is Inf or NaN (no other pass checks the
// gradients): the device's sum of squares is non-finite exactly when an element is, and the
// largest finite floats keep it finite (their squares overflow fp32, not fp64).
TEST_F(CudaModel, SumOfSquaresIsNonFiniteExactlyWhenAnElementIsAndHostTransfersMatchTheCpu) {
  const Device gpu = Device::cuda(0);
  constexpr float kMax = std::numeric_limits<float>::max();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20 | 3}) {
    std::vector<float> x = random_values(seed_, n, 1.0f);
    for (int64_t i = 0; i < n; i += 4099) x[static_cast<size_t>(i)] = -kMax;
    DeviceBuffer<float> d(gpu, n);
    copy_from_host(gpu, d.data(), x.data(), n);
    std::vector<float> back(static_cast<size_t>(n), NAN);
    copy_to_host(gpu, back.data(), d.data(), n);
    EXPECT_EQ(back, x) << n;
    const double want = kernels::sum_of_squares(Device::cpu(), x.data(), n);
    EXPECT_TRUE(std::isfinite(want)) << n;
    EXPECT_NEAR(kernels::sum_of_squares(gpu, d.data(), n), want, 1e-12 * want) << n;
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      for (int64_t at : {int64_t{0}, n - 1}) {  // the first block's head, the last block's tail
        std::vector<float> y = x;
        y[static_cast<size_t>(at)] = bad;
        copy_from_host(gpu, d.data(), y.data(), n);
        const double sum = kernels::sum_of_squares(gpu, d.data(), n);
        EXPECT_FALSE(std::isfinite(sum)) << n << " " << at << " " << bad;
        EXPECT_EQ(std::isnan(sum), std::isnan(bad)) << n << " " << at << " " << bad;
      }
    }
  }
}

// A tiny Llama-style config (RMSNorm, SwiGLU, RoPE, GQA, tied embeddings), 4 steps of 2 micro-batches.
std::string tiny_llama(const std::string& root) {
  return "model: {vocab_size: 0, d_model: 64, layers: 2, heads: 4, kv_heads: 2, ffn_size: 96, max_seq_len: 32,\n"
         "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true}\n" +
         train::testing::data_section(root) +
         "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 0.5, weight_decay: 0.1}\n"
         "train: {steps: 4, global_batch: 8, micro_batch: 4, threads: 1, seed: 7}\n"
         "log: {progress: false, interval: 100}\n";
}

// A GPU run's losses against the CPU's run of the same config: 4 steps, each within `relative`
// (1e-2 for the low-precision recipes) and printed, for the log.
void expect_losses_as_on_the_cpu(const std::vector<double>& cpu, const std::vector<double>& gpu, const std::string& what,
                                 double relative = 1e-2) {
  ASSERT_EQ(cpu.size(), 4u) << what;
  ASSERT_EQ(gpu.size(), 4u) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], relative * std::fabs(cpu[i])) << what << " step " << i + 1;
    std::printf("%s step %zu: loss cpu %.7f gpu %.7f\n", what.c_str(), i + 1, cpu[i], gpu[i]);
  }
}

TEST_F(CudaModel, TinyLlamaTrainsOnTheGpuAsOnTheCpu) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model");
  const std::string yaml = tiny_llama(root);
  const std::vector<double> cpu = train::testing::losses_of(train::testing::train_run(root, "cpu", yaml, {}));
  std::string console;
  const std::vector<double> gpu =
      train::testing::losses_of(train::testing::train_run(root, "gpu", yaml, {"runtime.device=cuda"}, &console));
  EXPECT_NE(console.find(" on cuda:0"), std::string::npos) << console;
  expect_losses_as_on_the_cpu(cpu, gpu, "fp32", 1e-4);
  // The checkpoint the GPU run wrote resumes on the CPU.
  const std::vector<double> resumed = train::testing::losses_of(
      train::testing::train_run(root, "gpu", yaml, {"train.steps=5", "train.resume=true"}));
  EXPECT_EQ(resumed.size(), 5u);
  std::filesystem::remove_all(root);
}

// The recipes' GEMMs in their real formats on the GPU (cuBLASLt bf16 and fp16, FP8 with per-tensor
// scales, current and delayed, MXFP8 decoded to bf16; fp16's loss scaling unscales on the device)
// against the CPU's exact emulation of the same formats: the products differ by fp32 summation
// order only (and, in the per-tensor FP8 forwards, fast accumulation's narrower running sums),
// which can move a rounded output by one bf16 ulp; four steps keep the losses within 1e-2
// relative. Both blocks run the FP8 and MX recipes (no bf16 edge blocks), so from the second step
// their per-tensor FP8 weights' amaxes and fp8_delayed's codes are the optimizer's (ZeRO 0).
TEST_F(CudaModel, TinyLlamaTrainsInTheLowPrecisionRecipesOnTheGpuAsOnTheCpu) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-precision");
  const std::string yaml = tiny_llama(root);
  for (const std::string recipe : {"bf16", "fp16", "mxfp8", "fp8_current", "fp8_delayed"}) {
    const std::vector<std::string> run = {"precision.recipe=" + recipe, "precision.fp8_edge_layers_bf16=false"};
    const std::vector<double> cpu =
        train::testing::losses_of(train::testing::train_run(root, recipe + "-cpu", yaml, run));
    std::vector<std::string> on_gpu = run;
    on_gpu.push_back("runtime.device=cuda");
    const std::vector<double> gpu =
        train::testing::losses_of(train::testing::train_run(root, recipe + "-gpu", yaml, on_gpu));
    expect_losses_as_on_the_cpu(cpu, gpu, recipe);
  }
  std::filesystem::remove_all(root);
}

// A GPT-2-style block (LayerNorm, GELU, learned positions, biases) under bf16 and fp8_current on
// the GPU as on the CPU's emulation: losses within 1e-2 relative over 4 steps. Its bf16 path keeps
// the q/k/v gradient bf16 (Attention::bf16_gradients, the bias's gradient summed by attention's
// backward) and runs GELU in the MLP's products' epilogues (Mlp::fuses_gelu: the up projection's
// bias summed over the hidden gradient its down projection's dgrad leaves); under FP8 the
// activation's kernels take the amaxes of the down projection's input and the up projection's
// output gradient.
TEST_F(CudaModel, TinyGpt2TrainsInBf16AndFp8OnTheGpuAsOnTheCpu) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-gpt2");
  const std::string yaml = tiny_llama(root);
  for (const std::string recipe : {"bf16", "fp8_current"}) {
    const std::vector<std::string> run = {"precision.recipe=" + recipe, "model.norm=layer", "model.activation=gelu",
                                          "model.positions=learned", "model.bias=true", "model.tied_embeddings=false",
                                          "model.kv_heads=4", "precision.fp8_edge_layers_bf16=false"};
    std::vector<std::string> on_gpu = run;
    on_gpu.push_back("runtime.device=cuda");
    using train::testing::losses_of, train::testing::train_run;
    const std::vector<double> cpu = losses_of(train_run(root, recipe + "-cpu", yaml, run));
    const std::vector<double> gpu = losses_of(train_run(root, recipe + "-gpu", yaml, on_gpu));
    expect_losses_as_on_the_cpu(cpu, gpu, "gpt2 " + recipe);
  }
  std::filesystem::remove_all(root);
}

// The model's attention on cuDNN's fused flash attention: head_dim 64 and plain causal rows, under
// LOOM_ATTENTION=cudnn so that every attention call must run there (an Error otherwise), trains
// under the bf16 recipe as the CPU's emulation of it: losses within 1e-2 relative over 4 steps.
// Skipped without cuDNN.
TEST_F(CudaModel, TinyLlamaWithCudnnAttentionTrainsInBf16AsOnTheCpu) {
  if (!cudnn_status().available) GTEST_SKIP() << "no cuDNN: " << cudnn_status().reason;
  if (cudnn_status().version == 91000 || cudnn_status().version == 91001)
    GTEST_SKIP() << "cuDNN " << cudnn_status().version << "'s SDPA is refused (known bugs)";
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-cudnn");
  const std::string yaml = tiny_llama(root);
  // Sequences of 128: cuDNN up to 9.15.0 serves the backward only at key lengths that are multiples of 128.
  const std::vector<std::string> run = {"precision.recipe=bf16", "model.d_model=128", "model.heads=2",
                                        "model.kv_heads=1", "model.max_seq_len=128", "data.seq_len=128"};
  const std::vector<double> cpu = train::testing::losses_of(train::testing::train_run(root, "cpu", yaml, run));
  std::vector<std::string> on_gpu = run;
  on_gpu.push_back("runtime.device=cuda");
  ::setenv("LOOM_ATTENTION", "cudnn", 1);
  std::vector<double> gpu;
  EXPECT_NO_THROW(gpu = train::testing::losses_of(train::testing::train_run(root, "gpu", yaml, on_gpu)));
  ::unsetenv("LOOM_ATTENTION");
  expect_losses_as_on_the_cpu(cpu, gpu, "cuDNN attention");
  std::filesystem::remove_all(root);
}

// A GPU run repeats bit for bit: loom's kernels add in fixed orders (no atomics; the embedding's
// gradient in sorted groups, grouped_rows.h) and cuBLASLt repeats a product for the plan it cached.
// Under the bf16 recipe at head_dim 64 (the tensor-core flash attention; LOOM_ATTENTION=loom, since
// cuDNN's backward accumulates dQ with atomics) two runs give the same losses to the last bit and
// the same parameters and moments.
TEST_F(CudaModel, TinyLlamaRunRepeatsBitForBitOnTheGpuWithLoomsAttention) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-repeat");
  const std::string yaml = tiny_llama(root);
  const std::vector<std::string> run = {"precision.recipe=bf16", "model.d_model=128", "model.heads=2",
                                        "model.kv_heads=1", "runtime.device=cuda"};
  // Set for the two runs only, unset however they end (a later test expects it unset).
  struct LoomAttention {
    LoomAttention() { ::setenv("LOOM_ATTENTION", "loom", 1); }
    ~LoomAttention() { ::unsetenv("LOOM_ATTENTION"); }
  };
  std::vector<double> first, second;
  {
    const LoomAttention loom_attention;
    first = train::testing::losses_of(train::testing::train_run(root, "first", yaml, run));
    second = train::testing::losses_of(train::testing::train_run(root, "second", yaml, run));
  }
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first, second);
  EXPECT_EQ(train::testing::checkpoint_difference(root, "first", "second",
                                                  [](const ckpt::LoadedCheckpoint& c) { return c.names(); }),
            0.0);
  std::filesystem::remove_all(root);
}

// Nemotron 3 Super's layer kinds on the GPU (testing::kTinySuperModel): Mamba-2 mixers, attention,
// a latent MoE layer (4 experts, top 2, a shared expert) and 2 multi-token prediction depths, 4
// steps against the CPU: fp32 within 1e-4 relative, and under bf16 and fp8_current (every block's
// linears FP8, the routed experts' rows padded to 16) within 1e-2; expert parallelism over two
// ranks sharing the GPU (its all-to-all staged through the host) as one CPU rank, fp32 within
// 1e-4, and under fp8_delayed as the CPU's ep 2 within 1e-2.
TEST_F(CudaModel, TinySuperHybridTrainsOnTheGpuAsOnTheCpu) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-super");
  const std::string yaml =
      std::string(train::testing::kTinySuperModel) + train::testing::data_section(root) +
      "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 0.5, weight_decay: 0.1}\n"
      "train: {steps: 4, global_batch: 8, micro_batch: 4, threads: 1, seed: 7}\n"
      "log: {progress: false, interval: 100}\n";
  using train::testing::losses_of, train::testing::train_run;
  const std::vector<std::tuple<std::string, std::vector<std::string>, double>> runs = {
      {"fp32", {}, 1e-4},
      {"bf16", {"precision.recipe=bf16"}, 1e-2},
      {"fp8-current", {"precision.recipe=fp8_current", "precision.fp8_edge_layers_bf16=false"}, 1e-2},
      {"ep2", {"runtime.ranks=2", "parallel.ep=2"}, 1e-4},
      {"fp8-delayed-ep2",
       {"precision.recipe=fp8_delayed", "precision.fp8_edge_layers_bf16=false", "runtime.ranks=2", "parallel.ep=2"},
       1e-2}};
  const std::vector<double> one = losses_of(train_run(root, "one-cpu", yaml, {}));
  for (const auto& [name, run, relative] : runs) {
    const bool fp32 = name == "fp32" || name == "ep2";
    const std::vector<double> cpu = fp32 ? one : losses_of(train_run(root, name + "-cpu", yaml, run));
    std::vector<std::string> on_gpu = run;
    on_gpu.push_back("runtime.device=cuda");
    const std::vector<double> gpu = losses_of(train_run(root, name + "-gpu", yaml, on_gpu));
    expect_losses_as_on_the_cpu(cpu, gpu, "super " + name, relative);
  }
  std::filesystem::remove_all(root);
}

// The parallel layouts with their ranks as threads sharing the one GPU (their collectives stage
// device buffers through the host: comm/device_staging.h) against one CPU rank: every layout
// computes the same function, so the losses agree within 1e-4 relative (fp32; other summation
// orders). The emulated device's tests (tests/train/device_*_test.cpp) check the same layouts bit
// for bit against the CPU's everywhere.
TEST_F(CudaModel, TinyLlamaLayoutsOnTheGpuTrainAsOneCpuRank) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-layouts");
  const std::string yaml = tiny_llama(root);
  const std::vector<double> one = train::testing::losses_of(train::testing::train_run(root, "one", yaml, {}));
  ASSERT_EQ(one.size(), 4u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"dp2", {"runtime.ranks=2"}},
      {"pp2", {"runtime.ranks=2", "parallel.pp=2"}},
      {"tp2", {"runtime.ranks=2", "parallel.tp=2"}},
      {"tp2-sp", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"cp2-ring", {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=p2p"}},
      {"zero3", {"runtime.ranks=2", "parallel.zero=3"}},
      {"zero1-overlapped-gathers", {"runtime.ranks=2", "parallel.zero=1", "parallel.overlap_param_gather=true"}},
  };
  for (const auto& [name, overrides] : layouts) {
    std::vector<std::string> on_gpu = overrides;
    on_gpu.push_back("runtime.device=cuda");
    const std::vector<double> gpu = train::testing::losses_of(train::testing::train_run(root, name, yaml, on_gpu));
    ASSERT_EQ(gpu.size(), 4u) << name;
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(gpu[i], one[i], 1e-4 * std::fabs(one[i])) << name << " step " << i + 1;
      std::printf("%s step %zu: loss one cpu rank %.7f gpu %.7f\n", name.c_str(), i + 1, one[i], gpu[i]);
    }
  }
  std::filesystem::remove_all(root);
}

// optim.cpu_offload: the moments in host memory and the update on the host's cores (the CPU's
// AdamW exactly), the values and gradients copied down and back each step. One rank, ZeRO 1 and
// ZeRO 3 over two ranks sharing the GPU, half the state offloaded (optim.offload_fraction: the
// other half updated on the GPU) and the bf16 recipe train as one CPU rank does (fp32:
// 1e-4 relative; bf16 1e-2), and one rank's GPU holds the moments' 8 bytes per parameter less;
// with ZeRO-3's shards in host memory too (parallel.offload_params), 8 more, of which the device's
// copy for the gathers (parallel.offload_params_device_copy) takes 4 back.
TEST_F(CudaModel, TinyLlamaWithTheOptimizerOffloadedTrainsAsOnTheCpu) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-model-offload");
  const std::string yaml = tiny_llama(root);
  const std::vector<double> one = train::testing::losses_of(train::testing::train_run(root, "one", yaml, {}));
  const std::vector<double> one_bf16 =
      train::testing::losses_of(train::testing::train_run(root, "one-bf16", yaml, {"precision.recipe=bf16"}));
  ASSERT_EQ(one.size(), 4u);
  const std::vector<std::tuple<std::string, std::vector<std::string>, const std::vector<double>*, double>> runs = {
      {"offload", {}, &one, 1e-4},
      {"offload-zero1", {"runtime.ranks=2", "parallel.zero=1"}, &one, 1e-4},
      {"offload-zero3", {"runtime.ranks=2", "parallel.zero=3"}, &one, 1e-4},
      {"offload-half", {"optim.offload_fraction=0.5"}, &one, 1e-4},
      {"offload-bf16", {"precision.recipe=bf16"}, &one_bf16, 1e-2},
      // ZeRO-3's shards in host memory too (parallel.offload_params): one rank and two ranks sharing
      // the GPU, fp32 and bf16 with the parameters gathered in bf16.
      {"offload-params", {"parallel.zero=3", "parallel.offload_params=true"}, &one, 1e-4},
      {"offload-params-zero3", {"runtime.ranks=2", "parallel.zero=3", "parallel.offload_params=true"}, &one, 1e-4},
      {"offload-params-bf16",
       {"runtime.ranks=2", "parallel.zero=3", "parallel.offload_params=true", "precision.recipe=bf16",
        "precision.param_dtype=compute"},
       &one_bf16,
       1e-2},
      // With the device's copy of the shards the gathers send from (parallel.offload_params_device_copy).
      {"offload-params-device-copy",
       {"parallel.zero=3", "parallel.offload_params=true", "parallel.offload_params_device_copy=true"},
       &one,
       1e-4},
      {"offload-params-device-copy-bf16",
       {"runtime.ranks=2", "parallel.zero=3", "parallel.offload_params=true",
        "parallel.offload_params_device_copy=true", "precision.recipe=bf16", "precision.param_dtype=compute"},
       &one_bf16,
       1e-2},
  };
  for (const auto& [name, overrides, reference, tolerance] : runs) {
    std::vector<std::string> on_gpu = overrides;
    on_gpu.insert(on_gpu.end(), {"runtime.device=cuda", "optim.cpu_offload=true"});
    const std::vector<double> gpu = train::testing::losses_of(train::testing::train_run(root, name, yaml, on_gpu));
    ASSERT_EQ(gpu.size(), 4u) << name;
    for (size_t i = 0; i < gpu.size(); ++i) {
      EXPECT_NEAR(gpu[i], (*reference)[i], tolerance * std::fabs((*reference)[i])) << name << " step " << i + 1;
      std::printf("%s step %zu: loss one cpu rank %.7f gpu %.7f\n", name.c_str(), i + 1, (*reference)[i], gpu[i]);
    }
  }
  // The device bytes committed after step 1 (the allocator counts the bytes asked for), with the
  // moments on the GPU and on the host, and the model's parameters.
  int64_t parameters = 0;
  auto committed_after_step = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), {"runtime.device=cuda", "train.steps=1"});
    std::string console;
    train::testing::train_run(root, name, yaml, overrides, &console);
    const size_t model = console.find("model: ");
    if (model != std::string::npos) parameters = std::stoll(console.substr(model + 7));
    const size_t at = console.find("at the peak of step 1, ");
    EXPECT_NE(at, std::string::npos) << console;
    return at == std::string::npos ? int64_t{0} : std::stoll(console.substr(at + 23));
  };
  const int64_t on_gpu = committed_after_step("memory-gpu", {});
  const int64_t on_host = committed_after_step("memory-host", {"optim.cpu_offload=true"});
  std::printf("committed after step 1: moments on the gpu %lld bytes, on the host %lld bytes (%lld parameters)\n",
              static_cast<long long>(on_gpu), static_cast<long long>(on_host), static_cast<long long>(parameters));
  ASSERT_GT(parameters, 0);
  EXPECT_EQ(on_gpu - on_host, 8 * parameters);
  // At ZeRO-3 on one rank, the parameter and gradient shards in host memory too: 8 bytes per
  // parameter more.
  const int64_t zero3 = committed_after_step("memory-zero3", {"parallel.zero=3", "optim.cpu_offload=true"});
  const int64_t shards = committed_after_step(
      "memory-shards", {"parallel.zero=3", "optim.cpu_offload=true", "parallel.offload_params=true"});
  std::printf("committed after step 1 at zero 3: shards on the gpu %lld bytes, on the host %lld bytes\n",
              static_cast<long long>(zero3), static_cast<long long>(shards));
  EXPECT_EQ(zero3 - shards, 8 * parameters);
  // The device's copy of the shard for the gathers (fp32 at one rank): 4 bytes per parameter back.
  const int64_t copied = committed_after_step("memory-shards-copy", {"parallel.zero=3", "optim.cpu_offload=true",
                                                                     "parallel.offload_params=true",
                                                                     "parallel.offload_params_device_copy=true"});
  std::printf("committed after step 1 with the device's copy of the shards: %lld bytes\n",
              static_cast<long long>(copied));
  EXPECT_EQ(copied - shards, 4 * parameters);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace loom::kernels::cuda
