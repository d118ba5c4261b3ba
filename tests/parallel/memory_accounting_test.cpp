// Per-rank model-state bytes follow the documented formulas (Megatron's distributed-optimizer
// table and mixed-precision Adam's 18 bytes/param for bf16 parameters with fp32 gradients).
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/parallel/data/memory_accounting.h"

namespace loom::parallel {
namespace {

constexpr int64_t kParams = 124'439'808;  // GPT-2 124M; divisible by 1, 2, 4 and 8

int64_t state_bytes(int zero, int dp, int param_bytes = 2, int grad_bytes = 4) {
  const MemoryBytes b = memory_per_rank({.params = kParams, .dp = dp, .zero = zero, .param_bytes = param_bytes,
                                         .grad_bytes = grad_bytes});
  return b.total();
}

TEST(MemoryAccounting, Bf16ParamsFp32GradsFollowTheFormula) {
  const int64_t n = kParams;
  for (int d : {1, 2, 4, 8}) {
    EXPECT_EQ(state_bytes(0, d), 18 * n);
    EXPECT_EQ(state_bytes(1, d), 6 * n + 12 * n / d);
    EXPECT_EQ(state_bytes(2, d), 2 * n + 16 * n / d);
    EXPECT_EQ(state_bytes(3, d), 18 * n / d);
  }
  const MemoryBytes z1 = memory_per_rank({.params = n, .dp = 4, .zero = 1});
  EXPECT_EQ(z1.parameters, 2 * n);
  EXPECT_EQ(z1.gradients, 4 * n);
  EXPECT_EQ(z1.master_weights, 4 * n / 4);
  EXPECT_EQ(z1.optimizer_moments, 8 * n / 4);
  EXPECT_EQ(z1.communication_buffers, 0);
}

TEST(MemoryAccounting, MegatronTableForOtherDtypes) {
  const int64_t n = kParams;
  for (int d : {1, 2, 8}) {
    EXPECT_EQ(state_bytes(0, d, 2, 2), 20 * n);  // fp16 params, fp16 grads (fp32 main grads)
    EXPECT_EQ(state_bytes(1, d, 2, 2), 4 * n + 16 * n / d);
    EXPECT_EQ(state_bytes(0, d, 4, 4), 16 * n);  // fp32 params are their own master weights
    EXPECT_EQ(state_bytes(1, d, 4, 4), 8 * n + 8 * n / d);
  }
}

TEST(MemoryAccounting, ShardsRoundUpAndCommBuffersAdd) {
  const MemoryBytes b = memory_per_rank({.params = 10, .dp = 3, .zero = 3, .comm_buffer_bytes = 100});
  EXPECT_EQ(b.parameters, 2 * 4);  // ceil(10 / 3) = 4 elements
  EXPECT_EQ(b.communication_buffers, 100);
  EXPECT_EQ(b.total(), 18 * 4 + 100);
  EXPECT_NE(describe_memory(b).find("total"), std::string::npos);
}

TEST(MemoryAccounting, RejectsBadInput) {
  EXPECT_THROW(memory_per_rank({.params = 10, .dp = 0}), Error);
  EXPECT_THROW(memory_per_rank({.params = 10, .zero = 4}), Error);
  EXPECT_THROW(memory_per_rank({.params = 10, .param_bytes = 3}), Error);
  EXPECT_THROW(memory_per_rank({.params = -1}), Error);
}

}  // namespace
}  // namespace loom::parallel
