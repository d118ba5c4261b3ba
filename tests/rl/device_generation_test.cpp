// GRPO's generation on the device: a group sampled through a `loom serve` worker whose engine runs
// on the emulated CUDA device (tests/support/emulated_cuda.h) holds exactly the tokens and
// log-probabilities of the same group from a cpu worker; and the controller starts generation
// workers on runtime.device.
#include <gtest/gtest.h>

#include <algorithm>

#include "../train/training_runs.h"
#include "loom/config/grpo_schema.h"
#include "loom/core/error.h"
#include "loom/infer/engine.h"
#include "loom/infer/speculative.h"
#include "loom/rl/agent_loop.h"
#include "loom/rl/env/env_server.h"
#include "loom/rl/launch/server_command.h"
#include "loom/serve/server.h"
#include "rl_test_support.h"
#include "support/emulated_cuda.h"

namespace loom::rl {
namespace {

// A GPT-2-style checkpoint (learned positions, biases, tied embeddings) with room for the chat prompt.
std::string gpt2_checkpoint() {
  static const std::string made = [] {
    const std::string root = train::testing::make_training_root("rl-device");
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, norm: layer, activation: gelu,\n"
        "        positions: learned, bias: true, tied_embeddings: true, max_seq_len: 160}\n"
        "optim: {lr: 3.0e-3}\ntrain: {steps: 2, global_batch: 4, micro_batch: 4, seed: 9}\n" +
        train::testing::data_section(root);
    train::testing::train_run(root, "gpt2", yaml, {});
    return root + "/gpt2/checkpoints";
  }();
  return made;
}

// One group sampled from a worker serving `checkpoint` on `device`.
RolloutGroup group_from_worker(const std::string& checkpoint, config::RuntimeDevice device,
                               const std::string& environment_url) {
  infer::EngineOptions engine_options;
  engine_options.device = device;
  engine_options.dtype = infer::InferenceDtype::Fp32;  // the same GEMMs on both (auto is bf16 on cuda)
  infer::Engine engine(checkpoint, engine_options);
  serve::ServeOptions serve_options;
  serve_options.port = 0;
  serve::Server server(engine, serve_options);
  testing::ServingThread thread([&](const std::function<void(int)>& on) { server.run(on); },
                                [&] { server.shutdown(); });
  AgentOptions o;
  o.model_url = thread.url();
  o.environment_url = environment_url;
  o.samples = 3;
  o.max_tokens = 6;
  o.seed = 11;
  return run_group(o, 7);
}

TEST(DeviceGeneration, AGroupFromADeviceWorkerEqualsTheCpuWorkers) {
  ::loom::testing::install_emulated_cuda();
  const std::string checkpoint = gpt2_checkpoint();
  EnvironmentServer env_server(make_environment({"arithmetic", 99, 1, 4}), "127.0.0.1", 0);
  testing::ServingThread env([&](const std::function<void(int)>& on) { env_server.run(on); },
                             [&] { env_server.stop(); });
  const RolloutGroup cpu = group_from_worker(checkpoint, config::RuntimeDevice::Cpu, env.url());
  const RolloutGroup device = group_from_worker(checkpoint, config::RuntimeDevice::Cuda, env.url());
  ASSERT_EQ(device.samples.size(), cpu.samples.size());
  for (size_t k = 0; k < cpu.samples.size(); ++k) {
    EXPECT_EQ(device.samples[k].tokens, cpu.samples[k].tokens) << "sample " << k;
    EXPECT_EQ(device.samples[k].trained, cpu.samples[k].trained) << "sample " << k;
    EXPECT_EQ(device.samples[k].generation_logprobs, cpu.samples[k].generation_logprobs) << "sample " << k;
    EXPECT_EQ(device.samples[k].reward, cpu.samples[k].reward) << "sample " << k;
    EXPECT_GT(std::count(cpu.samples[k].trained.begin(), cpu.samples[k].trained.end(), 1), 0) << "sample " << k;
  }
  EXPECT_EQ(device.weight_version, cpu.weight_version);
}

// The value after `flag` in a generation worker's command line under `config` ("" without one).
std::string worker_flag(const config::RunConfig& config, const std::string& flag) {
  const std::vector<std::string> argv = server_command(config, "generation", 0, "loom", "/ckpt", "");
  const auto at = std::find(argv.begin(), argv.end(), flag);
  return at != argv.end() && at + 1 != argv.end() ? *(at + 1) : "";
}

TEST(DeviceGeneration, GenerationWorkersRunOnTheRuntimeDeviceWithTheConfiguredDtype) {
  for (auto [device, name] : {std::pair{config::RuntimeDevice::Cpu, "cpu"}, {config::RuntimeDevice::Cuda, "cuda"}}) {
    config::RunConfig config;
    config.runtime.device = device;
    EXPECT_EQ(worker_flag(config, "--device"), name);
  }
  for (const char* dtype : {"auto", "bf16", "fp32"}) {
    config::RunConfig config;
    config.grpo.worker_dtype = dtype;
    EXPECT_EQ(worker_flag(config, "--dtype"), dtype);
  }
}

// grpo.worker_speculative_tokens: each worker drafts with the model's multi-token prediction depths.
TEST(DeviceGeneration, WorkersDraftWithTheModelsDepthsWhenAsked) {
  config::RunConfig config;
  EXPECT_EQ(worker_flag(config, "--speculative-config"), "");
  config.grpo.worker_speculative_tokens = 2;
  const std::string json = worker_flag(config, "--speculative-config");
  EXPECT_EQ(json, "{\"method\": \"mtp\", \"num_speculative_tokens\": 2}");
  EXPECT_EQ(infer::parse_speculative_config(json), 2);  // what `loom serve` reads back
  const std::string yaml = "model: {mtp_depths: 1}\ngrpo: {worker_speculative_tokens: 2}\n";
  try {
    config::check_grpo(config::parse_config(yaml, "grpo.yaml", {}));
    FAIL() << "2 drafts from 1 depth were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grpo.worker_speculative_tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.mtp_depths is 1"), std::string::npos) << e.what();
  }
  config::check_grpo(config::parse_config("model: {mtp_depths: 2}\ngrpo: {worker_speculative_tokens: 2}\n", "grpo.yaml", {}));
}

}  // namespace
}  // namespace loom::rl
