// loom generate on the emulated CUDA device (tests/support/emulated_cuda.h): the weights, the
// KV cache (and a hybrid model's Mamba states) and every decoding step on the device, the
// logits copied back for sampling on the host. The continuation equals the CPU's exactly, greedy
// and sampled, on a Llama-style, a GPT-2-style, an MoE and a hybrid Mamba-2 model, with fp32 and
// with bf16 GEMMs.
#include <gtest/gtest.h>

#include "engine_support.h"
#include "loom/infer/generate.h"
#include "support/emulated_cuda.h"

namespace loom::infer::testing {
namespace {

class DeviceGenerateTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ::loom::testing::install_emulated_cuda(); }
};

TEST_P(DeviceGenerateTest, ContinuationsOnTheDeviceEqualTheCpu) {
  const std::string ckpt = checkpoint_of(GetParam());
  Generator cpu(ckpt), cuda(ckpt, config::RuntimeDevice::Cuda, InferenceDtype::Fp32);
  GenerateOptions greedy;
  greedy.prompt = "Call me Ishmael. Some years ago";
  greedy.max_tokens = 20;
  greedy.sampling.temperature = 0.0;
  greedy.stop_at_eot = false;
  const std::string text = cpu.continue_text(greedy);
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(cuda.continue_text(greedy), text);
  GenerateOptions sampled = greedy;
  sampled.sampling.temperature = 1.0;
  sampled.sampling.top_k = 40;
  sampled.seed = 5;
  EXPECT_EQ(cuda.continue_text(sampled), cpu.continue_text(sampled));
}

// With bf16 GEMMs (`--dtype bf16`, auto's choice on cuda; its weight casts kept on the device):
// the CPU's bf16 continuation, bit for bit.
TEST_P(DeviceGenerateTest, Bf16ContinuationsOnTheDeviceEqualTheCpusBf16) {
  const std::string ckpt = checkpoint_of(GetParam());
  Generator cpu(ckpt, config::RuntimeDevice::Cpu, InferenceDtype::Bf16), cuda(ckpt, config::RuntimeDevice::Cuda);
  GenerateOptions greedy;
  greedy.prompt = "Call me Ishmael. Some years ago";
  greedy.max_tokens = 20;
  greedy.sampling.temperature = 0.0;
  greedy.stop_at_eot = false;
  const std::string text = cpu.continue_text(greedy);
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(cuda.continue_text(greedy), text);
  EXPECT_EQ(cuda.continue_text(greedy), text);  // the kept casts give the same again
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceGenerateTest, ::testing::Values("llama", "gpt2", "moe", "hybrid"));

}  // namespace
}  // namespace loom::infer::testing
