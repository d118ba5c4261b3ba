// precision.param_dtype=compute on the emulated device: the compact bf16 parameters, the fp32
// master weights and (ZeRO 1-3) the bf16 parameter gathers live on the device; the values are
// widened unit by unit (kernels::widen_floats) into granules committed for the unit and
// decommitted after it, so any host access to them, or any use of released values, crashes.
// Two data-parallel ranks at ZeRO 0-3 train three steps of two micro-batches each and equal the
// same run on the CPU bit for bit (losses, norms, and every rank's master weights), in the bf16
// recipe (the emulated device computes the recipe's GEMMs as the CPU emulates them). That it
// trains as one rank is tested in precision_training_test.cpp (ParametersInTheComputeDtype).
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/device_staging.h"
#include "loom/comm/launch.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "support/emulated_cuda.h"

namespace loom::train {
namespace {

struct CompactRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> master;  // per rank, its checkpoint ranges back to back
  bool operator==(const CompactRun&) const = default;
};

config::RunConfig compact_config(int zero) {
  config::RunConfig c;
  c.model.vocab_size = 53;
  c.model.d_model = 32;
  c.model.layers = 3;
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn_size = 48;
  c.model.max_seq_len = 16;
  c.precision.recipe = config::PrecisionRecipe::Bf16;
  c.precision.param_dtype = config::ParamDtype::Compute;
  c.parallel.zero = zero;
  c.parallel.bucket_mb = 0.01;  // several buckets
  return c;
}

std::vector<int32_t> tokens(int rank, int step, int micro, int salt) {
  std::vector<int32_t> out;
  for (int i = 0; i < 2 * 12; ++i) out.push_back((i * 7 + rank * 13 + step * 5 + micro * 3 + salt) % 53);
  return out;
}

CompactRun train_compact(int zero, Device device) {
  const config::RunConfig c = compact_config(zero);
  CompactRun run;
  run.master.resize(2);
  std::mutex mutex;
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = 2;
  comm::launch(options, [&](comm::Communicator& world) {
    std::unique_ptr<comm::Communicator> staged;
    comm::Communicator* dp = &world;
    if (device.is_cuda()) {
      staged = comm::stage_device_buffers(world, device);
      dp = staged.get();
    }
    model::Transformer model(c.model, {}, model::PrecisionPolicy::from_config(c.precision), {}, {}, device);
    model.initialize(3);
    parallel::DataParallelStep step(*dp, model, c);
    std::vector<double> losses, norms;
    for (int s = 1; s <= 3; ++s) {
      double loss = 0;
      for (int m = 0; m < 2; ++m) {
        const std::vector<int32_t> in = tokens(world.rank(), s, m, 1), target = tokens(world.rank(), s, m, 2);
        step.begin_micro_batch(m == 1);
        loss += model.forward_backward(in.data(), target.data(), 2, 12, 1.0f / 96);
        step.end_micro_batch(m == 1);
      }
      losses.push_back(loss);
      norms.push_back(step.step(1e-2, s));
    }
    std::vector<float> master;
    for (const parallel::OwnedRange& r : step.checkpoint_ranges()) {
      std::vector<float> part(static_cast<size_t>(r.end - r.begin));
      copy_to_host(device, part.data(), r.value, r.end - r.begin);
      master.insert(master.end(), part.begin(), part.end());
    }
    std::lock_guard<std::mutex> lock(mutex);
    run.master[world.rank()] = std::move(master);
    if (world.rank() == 0) {
      run.losses = losses;
      run.norms = norms;
    }
  });
  return run;
}

TEST(DeviceCompactParameters, ComputeDtypeParametersOnTheDeviceEqualTheCpuBitForBit) {
  testing::install_emulated_cuda();
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const CompactRun cpu = train_compact(zero, Device::cpu()), cuda = train_compact(zero, Device::cuda(0));
    ASSERT_EQ(cpu.losses.size(), 3u);
    EXPECT_FALSE(cpu.master[0].empty());
    EXPECT_EQ(cuda.losses, cpu.losses);
    EXPECT_EQ(cuda.norms, cpu.norms);
    EXPECT_EQ(cuda.master, cpu.master);
  }
}

}  // namespace
}  // namespace loom::train
