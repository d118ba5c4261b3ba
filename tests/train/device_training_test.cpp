// runtime.device=cuda on the emulated device of the tests (tests/support/emulated_cuda.h): the
// model's memory is device memory the host cannot read, and the ops are the CPU kernels, so a
// training run on it must equal the same run on the CPU bit for bit (losses and every tensor of
// the final checkpoint), and any host access to device memory in the model or trainer crashes.
// Checkpoints move freely between the two.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "support/emulated_cuda.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// Llama-style: RMSNorm, SwiGLU, RoPE, grouped-query attention, tied embeddings.
const char* kLlama =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true}\n";
// GPT-2-style: LayerNorm, GELU, learned positions, biases, an untied head.
const char* kGpt2 =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 4, ffn_size: 64, max_seq_len: 32,\n"
    "        norm: layer, activation: gelu, positions: learned, bias: true, tied_embeddings: false}\n";

class DeviceTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::loom::testing::install_emulated_cuda();
    root_ = testing::make_training_root("device-training");
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // 2 micro-batches of 2 per step, clipping on, weight decay on matrices.
  std::vector<double> train(const std::string& name, const char* model, std::vector<std::string> overrides,
                            int steps = 4, std::string* console = nullptr) {
    const std::string yaml = std::string(model) + testing::data_section(root_) +
                             "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 0.5, weight_decay: 0.1}\n"
                             "train: {steps: " + std::to_string(steps) +
                             ", global_batch: 4, micro_batch: 2, threads: 1, seed: 7}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::losses_of(testing::train_run(root_, name, yaml, overrides, console));
  }

  // Every tensor of the two runs' final checkpoints equal bit for bit.
  void expect_same_checkpoints(const std::string& a, const std::string& b) {
    const double difference =
        testing::checkpoint_difference(root_, a, b, [](const ckpt::LoadedCheckpoint& c) { return c.names(); },
                                       [](const std::string& name, double d) { EXPECT_EQ(d, 0.0) << name; });
    EXPECT_EQ(difference, 0.0);
  }

  void expect_bitwise_equal_runs(const char* model, const std::string& tag, std::vector<std::string> extra = {}) {
    std::vector<std::string> cuda = extra;
    cuda.push_back("runtime.device=cuda");
    const std::vector<double> on_cpu = train(tag + "-cpu", model, extra);
    std::string console;
    const std::vector<double> on_device = train(tag + "-cuda", model, cuda, 4, &console);
    EXPECT_NE(console.find(" on cuda:0"), std::string::npos) << console;
    EXPECT_GT(allocator(Device::cuda(0)).peak_bytes(), 0);
    ASSERT_EQ(on_cpu.size(), 4u);
    EXPECT_EQ(on_device, on_cpu);  // bit for bit: the same kernels in the same order
    expect_same_checkpoints(tag + "-cpu", tag + "-cuda");
  }

  static std::string root_;
};
std::string DeviceTraining::root_;

TEST_F(DeviceTraining, LlamaStyleOnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kLlama, "llama"); }

TEST_F(DeviceTraining, Gpt2StyleOnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kGpt2, "gpt2"); }

TEST_F(DeviceTraining, RecomputeOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "recompute", {"model.recompute=true"});
}

// A checkpoint written on the device resumes on the CPU (and the other way round) to the same
// next losses as the run that never stopped.
TEST_F(DeviceTraining, CheckpointsMoveBetweenDeviceAndCpu) {
  const std::vector<double> full = train("full", kLlama, {});
  // metrics.jsonl holds both segments' steps.
  train("from-device", kLlama, {"runtime.device=cuda"}, 2);
  EXPECT_EQ(train("from-device", kLlama, {"train.resume=true"}), full);
  train("from-cpu", kLlama, {}, 2);
  EXPECT_EQ(train("from-cpu", kLlama, {"train.resume=true", "runtime.device=cuda"}), full);
  expect_same_checkpoints("full", "from-device");
  expect_same_checkpoints("full", "from-cpu");
  // train.init_from reads the parameters onto the device too.
  const std::string init = "train.init_from=" + root_ + "/full/checkpoints";
  EXPECT_EQ(train("init-cuda", kLlama, {init, "runtime.device=cuda"}, 2), train("init-cpu", kLlama, {init}, 2));
}

// What the device does not run yet is refused before anything is built, naming the setting.
TEST_F(DeviceTraining, UnsupportedSettingsOnTheDeviceNameTheirKey) {
  auto error_of = [&](const char* model, std::vector<std::string> overrides) -> std::string {
    overrides.insert(overrides.begin(), "runtime.device=cuda");
    try {
      train("refused", model, overrides, 1);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of(kLlama, {"precision.recipe=fp16"}).find("precision.recipe=fp16"), std::string::npos);
  EXPECT_NE(error_of(kLlama, {"runtime.ranks=2", "train.micro_batch=1"}).find("runtime.ranks=1"), std::string::npos);
  EXPECT_NE(error_of(kLlama, {"model.moe_experts=4", "model.moe_top_k=2"}).find("mixture of experts"),
            std::string::npos);
  EXPECT_NE(error_of(kLlama, {"model.mtp_depths=1"}).find("model.mtp_depths"), std::string::npos);
  const std::string bad = error_of(kLlama, {"runtime.device=gpu"});
  EXPECT_NE(bad.find("runtime.device"), std::string::npos) << bad;
  EXPECT_NE(bad.find("cuda"), std::string::npos) << bad;
}

}  // namespace
}  // namespace loom::train
