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

// With fp32 GEMMs and with bf16 ones (`--dtype bf16`, auto's choice on cuda; the device keeps
// its weight casts, so a second continuation reads them).
TEST_P(DeviceGenerateTest, ContinuationsOnTheDeviceEqualTheCpu) {
  const std::string ckpt = checkpoint_of(GetParam());
  for (InferenceDtype dtype : {InferenceDtype::Fp32, InferenceDtype::Bf16}) {
    const std::string what = GetParam() + " " + config::to_string(dtype);
    Generator cpu(ckpt, config::RuntimeDevice::Cpu, dtype), cuda(ckpt, config::RuntimeDevice::Cuda, dtype);
    GenerateOptions greedy;
    greedy.prompt = "Call me Ishmael. Some years ago";
    greedy.max_tokens = 20;
    greedy.sampling.temperature = 0.0;
    greedy.stop_at_eot = false;
    const std::string text = cpu.continue_text(greedy);
    EXPECT_FALSE(text.empty()) << what;
    EXPECT_EQ(cuda.continue_text(greedy), text) << what;
    GenerateOptions sampled = greedy;
    sampled.sampling.temperature = 1.0;
    sampled.sampling.top_k = 40;
    sampled.seed = 5;
    EXPECT_EQ(cuda.continue_text(sampled), cpu.continue_text(sampled)) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceGenerateTest, ::testing::Values("llama", "gpt2", "moe", "hybrid"));

}  // namespace
}  // namespace loom::infer::testing
