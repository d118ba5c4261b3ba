#pragma once
// The fixture of the device training tests: runs of a small model on the emulated CUDA device
// (tests/support/emulated_cuda.h) beside the same runs on the CPU, which must agree bit for bit
// (the emulated device runs the CPU kernels, in the same order), and the two models they train.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "support/emulated_cuda.h"
#include "training_runs.h"

namespace loom::train {

namespace fs = std::filesystem;

// Llama-style: RMSNorm, SwiGLU, RoPE, grouped-query attention, tied embeddings.
inline constexpr const char* kLlama =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true}\n";
// GPT-2-style: LayerNorm, GELU, learned positions, biases, an untied head.
inline constexpr const char* kGpt2 =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 4, ffn_size: 64, max_seq_len: 32,\n"
    "        norm: layer, activation: gelu, positions: learned, bias: true, tied_embeddings: false}\n";

// The validation losses in run `name`'s metrics.
inline std::vector<double> validation_losses(const std::string& root, const std::string& name) {
  std::vector<double> losses;
  std::ifstream metrics(root + "/" + name + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("val_loss")) losses.push_back(record.at("val_loss").get<double>());
  }
  return losses;
}

class DeviceTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::loom::testing::install_emulated_cuda();
    root_ = testing::make_training_root("device-training");
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // 2 micro-batches of 2 per step, clipping on, weight decay on matrices: the metrics' records.
  std::vector<nlohmann::json> train_records(const std::string& name, const char* model,
                                            std::vector<std::string> overrides, int steps = 4,
                                            std::string* console = nullptr) {
    const std::string yaml = std::string(model) + testing::data_section(root_) +
                             "optim: {lr: 3.0e-3, warmup_steps: 2, clip_grad: 0.5, weight_decay: 0.1}\n"
                             "train: {steps: " + std::to_string(steps) +
                             ", global_batch: 4, micro_batch: 2, threads: 1, seed: 7}\n"
                             "log: {progress: false, interval: 100}\n";
    return testing::train_run(root_, name, yaml, overrides, console);
  }
  // The same run's losses.
  std::vector<double> train(const std::string& name, const char* model, std::vector<std::string> overrides,
                            int steps = 4, std::string* console = nullptr) {
    return testing::losses_of(train_records(name, model, std::move(overrides), steps, console));
  }

  // Every tensor of the two runs' final checkpoints equal bit for bit.
  void expect_same_checkpoints(const std::string& a, const std::string& b) {
    const double difference =
        testing::checkpoint_difference(root_, a, b, [](const ckpt::LoadedCheckpoint& c) { return c.names(); },
                                       [](const std::string& name, double d) { EXPECT_EQ(d, 0.0) << name; });
    EXPECT_EQ(difference, 0.0);
  }

  // A run stopped after 2 steps on one device and resumed on the other (both ways) gives the
  // losses and final checkpoint of the run `<tag>full` that never stopped; returns its losses.
  std::vector<double> expect_checkpoints_move_between_devices(const char* model, const std::string& tag) {
    const std::vector<double> full = train(tag + "full", model, {});
    // metrics.jsonl holds both segments' steps.
    train(tag + "from-device", model, {"runtime.device=cuda"}, 2);
    EXPECT_EQ(train(tag + "from-device", model, {"train.resume=true"}), full);
    train(tag + "from-cpu", model, {}, 2);
    EXPECT_EQ(train(tag + "from-cpu", model, {"train.resume=true", "runtime.device=cuda"}), full);
    expect_same_checkpoints(tag + "full", tag + "from-device");
    expect_same_checkpoints(tag + "full", tag + "from-cpu");
    return full;
  }

  // `extra` for both runs, `device_only` for the device's (e.g. runtime.device_comm).
  void expect_bitwise_equal_runs(const char* model, const std::string& tag, std::vector<std::string> extra = {},
                                 const std::vector<std::string>& device_only = {}) {
    std::vector<std::string> cuda = extra;
    cuda.push_back("runtime.device=cuda");
    cuda.insert(cuda.end(), device_only.begin(), device_only.end());
    const std::vector<double> on_cpu = train(tag + "-cpu", model, extra);
    std::string console;
    ::loom::testing::reset_emulated_census();
    const std::vector<double> on_device = train(tag + "-cuda", model, cuda, 4, &console);
    // Every device operation went on a rank's compute queue (core/compute_queue.h): none on the
    // process's queue 0, which on a GPU would be a stream unordered with the rank's.
    EXPECT_EQ(::loom::testing::emulated_census().by_queue.count(0), 0u);
    EXPECT_NE(console.find(" on cuda:0"), std::string::npos) << console;
    EXPECT_GT(allocator(Device::cuda(0)).peak_bytes(), 0);
    ASSERT_EQ(on_cpu.size(), 4u);
    EXPECT_EQ(on_device, on_cpu);  // bit for bit: the same kernels in the same order
    expect_same_checkpoints(tag + "-cpu", tag + "-cuda");
  }

  static std::string root_;
};
inline std::string DeviceTraining::root_;

}  // namespace loom::train
