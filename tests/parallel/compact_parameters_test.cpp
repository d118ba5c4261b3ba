// precision.param_dtype=compute at ZeRO 0: the model's parameters live in bf16 between uses and
// are widened unit by unit, so a forward computes exactly what a model holding bf16-rounded fp32
// parameters computes, only one unit's fp32 values are ever resident, and the allocated state is
// mixed-precision Adam's 18 bytes per parameter (bf16 parameters, fp32 gradients, master weights and moments).
#include <gtest/gtest.h>

#include "loom/comm/launch.h"
#include "loom/comm/reduce.h"
#include "loom/parallel/data/memory_accounting.h"
#include "loom/parallel/data/data_parallel_step.h"

namespace loom::parallel {
namespace {

config::ModelConfig small_model() {
  config::ModelConfig c;
  c.vocab_size = 53;
  c.d_model = 32;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 48;
  c.max_seq_len = 16;
  return c;
}

TEST(CompactParameters, ComputesWithRoundedParametersAndHoldsEighteenBytesPerParameter) {
  config::RunConfig config;
  config.model = small_model();
  config.precision.recipe = config::PrecisionRecipe::Bf16;
  config.precision.param_dtype = config::ParamDtype::Compute;
  std::vector<int32_t> tokens, targets;
  for (int i = 0; i < 2 * 12; ++i) {
    tokens.push_back((i * 7 + 1) % 53);
    targets.push_back((i * 5 + 2) % 53);
  }
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = 1;
  comm::launch(options, [&](comm::Communicator& world) {
    model::Transformer reference(config.model, {}, model::PrecisionPolicy::from_config(config.precision));
    reference.initialize(3);
    model::ParameterStore& ref = reference.params();
    std::vector<uint16_t> bits(static_cast<size_t>(ref.total()));
    comm::from_f32(bits.data(), ref.values(), ref.total(), DType::BF16);
    comm::to_f32(ref.values(), bits.data(), ref.total(), DType::BF16);

    model::Transformer model(config.model, {}, model::PrecisionPolicy::from_config(config.precision));
    model.initialize(3);
    DataParallelStep step(world, model, config);
    // Between units nothing of the fp32 values is resident.
    double zeros = 0;
    for (int64_t i = 0; i < model.params().total(); ++i) zeros += model.params().values()[i] == 0.0f;
    EXPECT_EQ(zeros, static_cast<double>(model.params().total()));
    EXPECT_EQ(model.forward_loss(tokens.data(), targets.data(), 2, 12),
              reference.forward_loss(tokens.data(), targets.data(), 2, 12));

    const int64_t n = model.params().total();
    const parallel::MemoryBytes bytes = step.memory_bytes();
    const parallel::MemoryBytes formula = parallel::memory_per_rank({n, 1, 0, 2, 4, 0});
    EXPECT_EQ(bytes.parameters, formula.parameters);
    EXPECT_EQ(bytes.gradients, formula.gradients);
    EXPECT_EQ(bytes.master_weights, formula.master_weights);
    EXPECT_EQ(bytes.optimizer_moments, formula.optimizer_moments);
    EXPECT_EQ(bytes.total(), 18 * n);
  });
}

// With the distributed optimizer over d ranks the persistent state is Megatron's 6 + 12/d bytes
// per parameter: bf16 parameters, the fp32 gradient buffer (the reduced shard written back into
// it), and ceil(N / d) elements of fp32 master weights and moments (one bucket here, so the
// shard is exactly that); staging buffers are reported apart.
TEST(CompactParameters, DistributedOptimizerHoldsSixPlusTwelveOverDBytesPerParameter) {
  for (int dp : {2, 3}) {
    config::RunConfig config;
    config.model = small_model();
    config.precision.recipe = config::PrecisionRecipe::Bf16;
    config.precision.param_dtype = config::ParamDtype::Compute;
    config.parallel.zero = 1;
    config.parallel.bucket_mb = 64.0;
    comm::LaunchOptions options;
    options.backend = "threads";
    options.ranks = dp;
    comm::launch(options, [&](comm::Communicator& world) {
      model::Transformer model(config.model, {}, model::PrecisionPolicy::from_config(config.precision));
      model.initialize(3);
      DataParallelStep step(world, model, config);
      if (world.rank() != 0) return;
      const int64_t n = model.params().total();
      const parallel::MemoryBytes bytes = step.memory_bytes();
      const parallel::MemoryBytes formula = parallel::memory_per_rank({n, dp, 1, 2, 4, 0});
      EXPECT_EQ(bytes.parameters, formula.parameters) << "dp " << dp;
      EXPECT_EQ(bytes.gradients, formula.gradients) << "dp " << dp;
      EXPECT_EQ(bytes.master_weights, formula.master_weights) << "dp " << dp;
      EXPECT_EQ(bytes.optimizer_moments, formula.optimizer_moments) << "dp " << dp;
      EXPECT_EQ(bytes.total() - bytes.communication_buffers, 6 * n + 12 * ((n + dp - 1) / dp)) << "dp " << dp;
    });
  }
}

}  // namespace
}  // namespace loom::parallel
