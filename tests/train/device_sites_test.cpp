// Training across sites on the emulated device, bit for bit as on the CPU.
//
// Hierarchical data parallelism (parallel.dp_sites): each bucket (ZeRO 0) or ZeRO-1/2 shard is
// padded on the device (device copies, or kernels::narrow_floats for a bf16 wire), reduce-scattered
// inside the site, and its shard all-reduced across sites by the cross-site worker's thread (a bf16
// crossing rounded and widened there with narrow_floats / widen_floats), then gathered inside the
// site again at ZeRO 0.
//
// DiLoCo (parallel.outer=diloco): the anchor, momentum and delta live on the device and the outer
// Nesterov step runs through device entries (kernels::nesterov_outer_update); its checkpoints
// (outer state, other sites' parameters and moments) move between the device and the CPU.
#include "device_training.h"
#include "support/emulated_device_comm.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

// 4 ranks as 2 sites of 2, one sample per rank and micro-batch, small buckets (several per step).
std::vector<std::string> two_sites(int zero) {
  return {"runtime.ranks=4", "train.micro_batch=1", "parallel.dp_sites=2", "parallel.bucket_mb=0.01",
          "parallel.zero=" + std::to_string(zero)};
}

TEST_F(DeviceLayouts, TwoSitesOnTheDeviceEqualTheCpuBitForBit) {
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    expect_bitwise_equal_runs(kLlama, "sites-zero" + std::to_string(zero), two_sites(zero));
  }
  // The sites placed by the topology (one rank per node, two nodes per site) instead.
  const std::vector<std::string> topology = {"runtime.ranks=4", "train.micro_batch=1", "parallel.bucket_mb=0.01",
                                             "topology.ranks_per_node=1", "topology.nodes_per_site=2"};
  expect_bitwise_equal_runs(kLlama, "sites-topology", topology);
  std::vector<std::string> on_device = topology;
  on_device.push_back("runtime.device=cuda");
  const std::vector<nlohmann::json> records = train_records("sites-topology-metrics", kLlama, on_device, 1);
  ASSERT_FALSE(records.empty());
  EXPECT_GT(records.front().value("cross_site_bytes", int64_t{0}), 0);  // it did train across sites
}

// The cross-site hop in bf16 (rounded and widened by the worker on the device), alone and under
// the bf16 gradient wire (bf16 inside the site too), and with compute-dtype parameters.
TEST_F(DeviceLayouts, Bf16CrossSiteReductionOnTheDeviceEqualsTheCpuBitForBit) {
  for (int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    std::vector<std::string> overrides = two_sites(zero);
    overrides.push_back("parallel.cross_site_reduce=bf16");
    expect_bitwise_equal_runs(kLlama, "sites-bf16-cross-zero" + std::to_string(zero), overrides);
    overrides.push_back("precision.grad_reduce=bf16");
    expect_bitwise_equal_runs(kLlama, "sites-bf16-wire-zero" + std::to_string(zero), overrides);
  }
  // The bf16 recipe with bf16 parameters (master weights on the device) across sites.
  std::vector<std::string> compact = two_sites(0);
  compact.insert(compact.end(), {"parallel.cross_site_reduce=bf16", "precision.grad_reduce=bf16",
                                 "precision.recipe=bf16", "precision.param_dtype=compute"});
  expect_bitwise_equal_runs(kLlama, "sites-bf16-params-zero0", compact);
}

// Every device operation of a rank goes on that rank's compute queue (core/compute_queue.h), the
// bf16 crossing's rounding and widening on the cross-site worker's thread included: on a GPU, a
// stream per rank, and nothing on the process's queue 0.
TEST_F(DeviceLayouts, EveryRanksDeviceWorkGoesOnItsOwnComputeQueue) {
  std::vector<std::string> overrides = two_sites(0);
  overrides.insert(overrides.end(), {"parallel.cross_site_reduce=bf16", "runtime.device=cuda"});
  loom::testing::reset_emulated_census();
  train("sites-queues", kLlama, overrides, 2);
  const loom::testing::EmulatedCensus census = loom::testing::emulated_census();
  EXPECT_GT(census.entries.count("widen_floats"), 0u);  // the worker did device work
  std::vector<int> queues;
  for (const auto& [queue, operations] : census.by_queue) queues.push_back(queue);
  EXPECT_EQ(queues, (std::vector<int>{1, 2, 3, 4}));
}

// GPT-2 style (biases, untied head) with recompute; one rank per site (buckets cross whole).
TEST_F(DeviceLayouts, TwoSitesGpt2StyleOnTheDeviceEqualTheCpuBitForBit) {
  std::vector<std::string> overrides = two_sites(1);
  overrides.push_back("model.recompute=true");
  expect_bitwise_equal_runs(kGpt2, "sites-gpt2-zero1", overrides);
  expect_bitwise_equal_runs(kGpt2, "sites-gpt2-one-per-site",
                            {"runtime.ranks=2", "train.micro_batch=2", "parallel.dp_sites=2",
                             "parallel.cross_site_reduce=bf16"});
}

// Syncs at steps 2 and 4 (H = 2); with two fragments each half of the model syncs at its own step.
std::vector<std::string> diloco(int zero, int fragments) {
  std::vector<std::string> overrides = two_sites(zero);
  overrides.insert(overrides.end(), {"parallel.outer=diloco", "parallel.outer_steps=2",
                                     "parallel.outer_fragments=" + std::to_string(fragments)});
  return overrides;
}

TEST_F(DeviceLayouts, DilocoOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "diloco-zero0", diloco(0, 1));
  expect_bitwise_equal_runs(kLlama, "diloco-zero1-fragments", diloco(1, 2));
  std::vector<std::string> gpt2 = diloco(2, 2);
  gpt2.push_back("model.recompute=true");
  expect_bitwise_equal_runs(kGpt2, "diloco-gpt2-zero2", gpt2);
}

// runtime.device_comm=nccl (the emulated device backend, which refuses host memory): the site and
// cross-site groups are split from the device backend's world too, and the cross-site worker's
// all-reduces and DiLoCo's outer all-reduce go that way. One rank per site here; two below.
TEST_F(DeviceLayouts, SitesAndDilocoWithADeviceBackendEqualTheCpuBitForBit) {
  ::loom::testing::install_emulated_device_communicator();
  const std::vector<std::string> layout = {"runtime.ranks=2", "train.micro_batch=2", "parallel.dp_sites=2"};
  int64_t before = ::loom::testing::emulated_device_operations();
  expect_bitwise_equal_runs(kLlama, "sites-device-comm", layout, {"runtime.device_comm=nccl"});
  EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0);
  std::vector<std::string> outer = layout;
  outer.insert(outer.end(), {"parallel.outer=diloco", "parallel.outer_steps=2", "parallel.outer_fragments=2"});
  before = ::loom::testing::emulated_device_operations();
  expect_bitwise_equal_runs(kLlama, "diloco-device-comm", outer, {"runtime.device_comm=nccl"});
  EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0);
}

// Two sites of two ranks each over the device backend (a GPU per rank: the emulated machine has
// four), under NCCL's semantics (one operation at a time per group, rendezvous_comm.h): each
// rank's training thread reduce-scatters inside its site on one device group while its cross-site
// worker all-reduces the shard on another, the two driven concurrently, at ZeRO 0 and 1 and with
// the bf16 crossing.
TEST_F(DeviceLayouts, TwoRanksPerSiteWithADeviceBackendEqualTheCpuBitForBit) {
  ::loom::testing::install_emulated_device_communicator(/*rendezvous=*/true);
  for (int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const int64_t before = ::loom::testing::emulated_device_operations();
    expect_bitwise_equal_runs(kLlama, "sites-device-comm-4-zero" + std::to_string(zero), two_sites(zero),
                              {"runtime.device_comm=nccl"});
    EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0);
  }
  std::vector<std::string> bf16 = two_sites(0);
  bf16.push_back("parallel.cross_site_reduce=bf16");
  expect_bitwise_equal_runs(kLlama, "sites-device-comm-4-bf16", bf16, {"runtime.device_comm=nccl"});
  ::loom::testing::install_emulated_device_communicator();  // the other tests' plain backend
}

// A DiLoCo run stopped at step 3 (between its fragments' syncs: site 1's parameters and moments
// and the outer state differ from a plain checkpoint) on one device and resumed on the other
// gives the uninterrupted run's losses and final checkpoint.
TEST_F(DeviceLayouts, DilocoCheckpointsMoveBetweenDeviceAndCpu) {
  const std::vector<std::string> layout = diloco(1, 2);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = layout;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  const std::vector<double> full = train("diloco-move-full", kLlama, layout);
  ASSERT_EQ(full.size(), 4u);
  // train.exit_interval (not fewer train.steps, which would change the learning-rate schedule).
  ASSERT_EQ(train("diloco-move-from-device", kLlama, with({"runtime.device=cuda", "train.exit_interval=3"})).size(), 3u);
  EXPECT_EQ(train("diloco-move-from-device", kLlama, with({"train.resume=true"})), full);
  ASSERT_EQ(train("diloco-move-from-cpu", kLlama, with({"train.exit_interval=3"})).size(), 3u);
  EXPECT_EQ(train("diloco-move-from-cpu", kLlama, with({"train.resume=true", "runtime.device=cuda"})), full);
  expect_same_checkpoints("diloco-move-full", "diloco-move-from-device");
  expect_same_checkpoints("diloco-move-full", "diloco-move-from-cpu");
}

}  // namespace
}  // namespace loom::train
