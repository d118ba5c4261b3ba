// runtime.device_comm=nccl for the layouts that send and receive: pipeline parallelism and ring
// attention, with the device backend (the emulated one, standing in for NCCL) given NCCL's
// point-to-point semantics (support/rendezvous_comm.h: one operation at a time per group, a send
// completes only when the peer's recv runs, messages between two ranks matched in issue order,
// tags ignored). Each run equals the same layout on the CPU bit for bit (losses and every
// checkpoint tensor); that the CPU layouts train as one rank does is tested in
// pipeline_parallel_test.cpp and context_parallel_test.cpp. Before the stages' and the ring's
// sends and recvs went as batches (Communicator::exchange_async), these runs deadlocked under
// these semantics: every stage sent before it received (exchange_test.cpp shows that pattern
// timing out).
#include "device_training.h"
#include "support/emulated_device_comm.h"

namespace loom::train {
namespace {

// The device backend with NCCL's semantics; checks that device buffers went its way.
class DeviceLayoutsOverNccl : public DeviceTraining {
 protected:
  void expect_bitwise_equal_over_nccl(const char* model, const std::string& tag, std::vector<std::string> overrides) {
    ::loom::testing::install_emulated_device_communicator(/*rendezvous=*/true);
    const int64_t before = ::loom::testing::emulated_device_operations();
    overrides.push_back("runtime.timeout_s=30");  // a deadlock fails in seconds, naming the send
    expect_bitwise_equal_runs(model, tag, overrides, {"runtime.device_comm=nccl"});
    EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0);
  }
};

std::vector<std::string> pp2(const std::string& schedule, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=" + schedule};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return overrides;
}

// 4 micro-batches of 1: 1F1B's steady state, where each stage sends while the other sends back;
// evaluation runs through the stages too.
TEST_F(DeviceLayoutsOverNccl, Pipeline1f1bOverNcclEqualsTheCpuBitForBit) {
  expect_bitwise_equal_over_nccl(kLlama, "nccl-pp2-1f1b",
                                 pp2("1f1b", {"train.micro_batch=1", "data.val_prefix=" + root_ + "/data/c_train",
                                              "train.eval_interval=2", "train.eval_batches=2"}));
  EXPECT_EQ(validation_losses(root_, "nccl-pp2-1f1b-cuda"), validation_losses(root_, "nccl-pp2-1f1b-cpu"));
}

TEST_F(DeviceLayoutsOverNccl, Pipeline1f1bWithRecomputeOverNcclEqualsTheCpuBitForBit) {
  expect_bitwise_equal_over_nccl(kGpt2, "nccl-pp2-1f1b-recompute",
                                 pp2("1f1b", {"train.micro_batch=1", "model.recompute=true"}));
}

// Two model chunks per rank: messages in both directions between the same two ranks. With as
// many micro-batches as stages (2) every forward comes first; with more, the steady state's
// steps each exchange with both neighbours in one batch (pipeline_schedule.cpp), the order
// under which no stage waits in a send for a recv its neighbour posts only later.
TEST_F(DeviceLayoutsOverNccl, InterleavedPipelineOverNcclEqualsTheCpuBitForBit) {
  expect_bitwise_equal_over_nccl(kLlama, "nccl-pp2-interleaved", pp2("interleaved", {"parallel.virtual_stages=2", "model.layers=4"}));
  expect_bitwise_equal_over_nccl(kGpt2, "nccl-pp2-interleaved-recompute",
                                 pp2("interleaved", {"parallel.virtual_stages=2", "model.layers=4", "model.recompute=true"}));
}

// 4 and 6 micro-batches on 2 stages of 2 chunks (6: a partial group of the steady state), and
// 3 chunks per rank.
TEST_F(DeviceLayoutsOverNccl, InterleavedPipelineWithMoreMicroBatchesThanStagesOverNcclEqualsTheCpuBitForBit) {
  expect_bitwise_equal_over_nccl(kLlama, "nccl-pp2-interleaved-4",
                                 pp2("interleaved", {"parallel.virtual_stages=2", "model.layers=4", "train.micro_batch=1"}));
  expect_bitwise_equal_over_nccl(kGpt2, "nccl-pp2-interleaved-6-recompute",
                                 pp2("interleaved", {"parallel.virtual_stages=2", "model.layers=4", "train.global_batch=6",
                                                     "train.micro_batch=1", "model.recompute=true"}));
  expect_bitwise_equal_over_nccl(kLlama, "nccl-pp2-v3-interleaved-4",
                                 pp2("interleaved", {"parallel.virtual_stages=3", "model.layers=6", "train.micro_batch=1"}));
}

// 3 stages of 2 chunks: neighbours on both sides are different ranks, the last stage's output
// goes around to the first; with 3 micro-batches (every forward first) and 6.
TEST_F(DeviceLayoutsOverNccl, InterleavedPipelineOnThreeStagesOverNcclEqualsTheCpuBitForBit) {
  const std::vector<std::string> pp3 = {"runtime.ranks=3", "parallel.pp=3", "parallel.pipeline_schedule=interleaved",
                                        "parallel.virtual_stages=2", "model.layers=6", "train.micro_batch=1"};
  std::vector<std::string> three = pp3, six = pp3;
  three.push_back("train.global_batch=3");
  six.insert(six.end(), {"train.global_batch=6", "model.recompute=true"});
  expect_bitwise_equal_over_nccl(kLlama, "nccl-pp3-interleaved-3", three);
  expect_bitwise_equal_over_nccl(kGpt2, "nccl-pp3-interleaved-6-recompute", six);
}

TEST_F(DeviceLayoutsOverNccl, GpipeOverNcclEqualsTheCpuBitForBit) {
  expect_bitwise_equal_over_nccl(kGpt2, "nccl-pp2-gpipe", pp2("gpipe"));
}

// Every rank sends its key/value block to the next while receiving the previous one's.
TEST_F(DeviceLayoutsOverNccl, RingAttentionOverNcclEqualsTheCpuBitForBit) {
  expect_bitwise_equal_over_nccl(kLlama, "nccl-cp2-p2p", {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=p2p"});
  expect_bitwise_equal_over_nccl(kGpt2, "nccl-cp2-p2p-recompute",
                                 {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=p2p", "model.recompute=true"});
}

// A pipeline checkpoint written over NCCL resumes on the CPU to the run that never stopped.
TEST_F(DeviceLayoutsOverNccl, PipelineOverNcclCheckpointResumesOnTheCpu) {
  ::loom::testing::install_emulated_device_communicator(/*rendezvous=*/true);
  const std::vector<std::string> layout = pp2("1f1b", {"train.micro_batch=1", "runtime.timeout_s=30"});
  const std::vector<double> full = train("nccl-pp2-full", kLlama, layout);
  ASSERT_EQ(full.size(), 4u);
  std::vector<std::string> on_device = layout;
  on_device.insert(on_device.end(), {"runtime.device=cuda", "runtime.device_comm=nccl"});
  train("nccl-pp2-from-device", kLlama, on_device, 2);
  std::vector<std::string> resume = layout;
  resume.push_back("train.resume=true");
  EXPECT_EQ(train("nccl-pp2-from-device", kLlama, resume), full);
  expect_same_checkpoints("nccl-pp2-full", "nccl-pp2-from-device");
}

}  // namespace
}  // namespace loom::train
