// optim.cpu_offload on the emulated CUDA device: the optimizer's moments in host memory and its
// update on the host (optim/host_offload.h), the values and gradients on the device, whose memory
// the host cannot touch and whose ops refuse host memory. Every ZeRO stage, with and without
// parameters in the compute dtype and under FP8 (where the optimizer then writes no bf16 copy or
// FP8 codes), with tensor, pipeline and expert parallelism, and with a fraction of the state
// offloaded, trains as the same run on the CPU does, bit for bit; its checkpoints hold the same
// state and resume with the offload on or off; the device holds 8 bytes per owned parameter less.
// With parallel.offload_params ZeRO-3's parameter and gradient shards are in host memory too: the
// same bits, 8 more bytes per owned parameter off the device; with parallel.offload_params_device_copy
// the gathers send from a copy of the shard the device keeps: the same bits again, that copy's bytes
// back on the device and the per-gather copies off the link.
#include <regex>

#include "device_training.h"

namespace loom::train {
namespace {

const std::string kOffload = "optim.cpu_offload=true";
const std::string kOffloadParams = "parallel.offload_params=true";
const std::string kDeviceCopy = "parallel.offload_params_device_copy=true";

// A dense block, then one of 4 experts (the experts' own parameter group under ep 2).
constexpr const char* kMoe =
    "model: {vocab_size: 0, d_model: 16, layers: 2, heads: 2, ffn_size: 32, max_seq_len: 32,\n"
    "        tied_embeddings: false, block_configs: [{ffn: dense}, {ffn: moe}],\n"
    "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16}\n";

// ZeRO-3 with micro-batches of one (two per rank and step), then `extra`.
std::vector<std::string> zero3_rounds(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"train.micro_batch=1", "parallel.zero=3"});
  return extra;
}

std::vector<std::string> zero(int stage, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {"runtime.ranks=2", "train.micro_batch=1",
                                       "parallel.zero=" + std::to_string(stage)};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return overrides;
}

class DeviceOffload : public DeviceTraining {
 protected:
  // ZeRO-3 over dp 2 on the device with `base`: a run stopped at step 2 with `key` set resumes
  // without it, and one stopped without it resumes with it, to the uninterrupted run's losses and
  // final checkpoint (which ran without it).
  void expect_resumes_either_way(const std::string& tag, const std::vector<std::string>& base,
                                 const std::string& key) {
    std::vector<std::string> run = zero3_rounds({"runtime.ranks=2", "runtime.device=cuda"});
    run.insert(run.end(), base.begin(), base.end());
    const std::vector<double> full = train(tag + "-full", kLlama, run);
    ASSERT_EQ(full.size(), 4u);
    for (const bool key_first : {true, false}) {
      const std::string name = tag + (key_first ? "-then-without" : "-then-with");
      std::vector<std::string> first = run, then = run;
      (key_first ? first : then).push_back(key);
      train(name, kLlama, first, 2);
      then.push_back("train.resume=true");
      EXPECT_EQ(train(name, kLlama, then), full) << name;
      expect_same_checkpoints(tag + "-full", name);
    }
  }
};

TEST_F(DeviceOffload, EveryZeroStageEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "offload-one-rank", {}, {kOffload});
  expect_bitwise_equal_runs(kGpt2, "offload-gpt2", {}, {kOffload});
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(stage);
    expect_bitwise_equal_runs(kLlama, "offload-zero" + std::to_string(stage), zero(stage), {kOffload});
  }
}

// optim.offload_fraction: the first share of each stage's state has its moments on the host, the
// rest on the device (a piece crossing the boundary cut in two), each updated where its moments
// are; bit for bit the CPU's run still, and a checkpoint resumes under another split.
TEST_F(DeviceOffload, AFractionOffloadedEqualsTheCpuBitForBit) {
  const std::string fraction = "optim.offload_fraction=0.3";
  expect_bitwise_equal_runs(kLlama, "offload-fraction-one-rank", {}, {kOffload, fraction});
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(stage);
    expect_bitwise_equal_runs(kLlama, "offload-fraction-zero" + std::to_string(stage), zero(stage),
                              {kOffload, fraction});
  }
  const std::vector<double> full = train("offload-fraction-full", kLlama, zero(3));
  train("offload-fraction-resumed", kLlama, zero(3, {"runtime.device=cuda", kOffload, fraction}), 2);
  EXPECT_EQ(train("offload-fraction-resumed", kLlama,
                  zero(3, {"runtime.device=cuda", "train.resume=true", kOffload, "optim.offload_fraction=0.8"})),
            full);
  expect_same_checkpoints("offload-fraction-full", "offload-fraction-resumed");
}

// Each rank offloads its own part: a tensor-parallel rank its shards, a pipeline stage its layers,
// the experts' group (ep 2, its parameter group's own distributed optimizer) its experts.
TEST_F(DeviceOffload, TensorPipelineAndExpertParallelRanksEqualTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "offload-tp2", {"runtime.ranks=2", "parallel.tp=2"}, {kOffload});
  expect_bitwise_equal_runs(kLlama, "offload-pp2-zero1", {"runtime.ranks=4", "parallel.pp=2", "train.micro_batch=1",
                                                          "parallel.zero=1"},
                            {kOffload});
  expect_bitwise_equal_runs(kMoe, "offload-ep2-zero1",
                            {"runtime.ranks=2", "parallel.ep=2", "train.micro_batch=1", "parallel.zero=1"}, {kOffload});
}

// The stages round the values into the compact parameters themselves, and the model casts its
// weights, where an optimizer on the device would have written them.
TEST_F(DeviceOffload, CompactParametersAndFp8EqualTheCpuBitForBit) {
  for (int stage : {0, 1, 3}) {
    SCOPED_TRACE(stage);
    expect_bitwise_equal_runs(kLlama, "offload-compact-zero" + std::to_string(stage),
                              zero(stage, {"precision.recipe=bf16", "precision.param_dtype=compute"}), {kOffload});
  }
  expect_bitwise_equal_runs(kLlama, "offload-bf16", {"precision.recipe=bf16"}, {kOffload});
  expect_bitwise_equal_runs(kLlama, "offload-fp8-delayed", {"precision.recipe=fp8_delayed"}, {kOffload});
}

// A checkpoint of an offloaded run holds the moments as any other: it resumes with the offload on
// or off to the uninterrupted run's losses and final state.
TEST_F(DeviceOffload, CheckpointsResumeWithTheOffloadOnOrOff) {
  const std::vector<double> full = train("offload-ckpt-full", kLlama, zero(1));
  ASSERT_EQ(full.size(), 4u);
  for (const bool offload_after : {true, false}) {
    const std::string name = std::string("offload-ckpt-then-") + (offload_after ? "on" : "off");
    train(name, kLlama, zero(1, {"runtime.device=cuda", kOffload}), 2);
    std::vector<std::string> resume = zero(1, {"runtime.device=cuda", "train.resume=true"});
    if (offload_after) resume.push_back(kOffload);
    EXPECT_EQ(train(name, kLlama, resume), full) << name;
    expect_same_checkpoints("offload-ckpt-full", name);
  }
}

// Rank 0's committed device bytes after step 1, and the start-up report's host moments (MiB).
struct Held {
  int64_t parameters = 0, device_after = 0;
  double host_moments_mib = 0.0, host_parameters_mib = 0.0, host_gradients_mib = 0.0;
};

class DeviceOffloadMemory : public DeviceTraining {
 protected:
  Held held(const std::string& tag, std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), {"runtime.device=cuda", "model.layers=8"});
    std::string console;
    train(tag, kLlama, overrides, 1, &console);
    Held h;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(console, m, std::regex(R"(model: (\d+) parameters)"))) << console;
    if (!m.empty()) h.parameters = std::stoll(m[1]);
    const std::regex committed(R"(cuda:0 committed: \d+ bytes \([^)]*\) at the peak of step 1, (\d+) bytes after it)");
    EXPECT_TRUE(std::regex_search(console, m, committed)) << console;
    if (!m.empty()) h.device_after = std::stoll(m[1]);
    const std::pair<const char*, double*> on_host[] = {{"optimizer moments", &h.host_moments_mib},
                                                        {"parameters", &h.host_parameters_mib},
                                                        {"gradients", &h.host_gradients_mib}};
    for (const auto& [what, mib] : on_host) {
      if (std::regex_search(console, m, std::regex(std::string("; ") + what + R"( in host memory ([0-9.]+) MiB)"))) {
        *mib = std::stod(m[1]);
      }
    }
    return h;
  }
};

// One rank holds every parameter's two moments: 8P bytes leave the device for the host; at ZeRO 1
// over dp 2 its shard's, about 4P (the buckets' shards padded to the ranks).
TEST_F(DeviceOffloadMemory, TheMomentsLeaveTheDevice) {
  const Held on = held("offload-memory-on", {kOffload}), off = held("offload-memory-off", {});
  ASSERT_GT(on.parameters, 10000);
  EXPECT_EQ(off.device_after - on.device_after, 8 * on.parameters);
  EXPECT_NEAR(on.host_moments_mib, 8.0 * static_cast<double>(on.parameters) / (1024.0 * 1024.0), 0.01);
  EXPECT_EQ(off.host_moments_mib, 0.0);

  // A quarter offloaded: a quarter of those bytes.
  const Held quarter = held("offload-memory-quarter", {kOffload, "optim.offload_fraction=0.25"});
  EXPECT_NEAR(static_cast<double>(off.device_after - quarter.device_after), 2.0 * on.parameters, 8.0);

  // ZeRO-3's shards in host memory too: the fp32 parameter shard and the gradient shard, 8P more
  // bytes at one rank, reported as host memory; what crosses the link goes through the transfer
  // staging: the step's two micro-batches' gathers, forward and backward (16P bytes less the
  // head's section, held from its forward into its backward), and their reduced gradients (8P).
  const std::vector<std::string> zero3 = {"parallel.zero=3", kOffload};
  const Held zero3_moments = held("offload-memory-zero3", zero3);
  std::vector<std::string> zero3_params = zero3;
  zero3_params.push_back(kOffloadParams);
  ::loom::testing::reset_emulated_census();
  const Held shards = held("offload-memory-zero3-params", zero3_params);
  EXPECT_GE(::loom::testing::emulated_census().staged_transfer_bytes, 20 * shards.parameters);
  EXPECT_EQ(zero3_moments.device_after - shards.device_after, 8 * on.parameters);
  EXPECT_NEAR(shards.host_parameters_mib, 4.0 * static_cast<double>(on.parameters) / (1024.0 * 1024.0), 0.01);
  EXPECT_NEAR(shards.host_gradients_mib, 4.0 * static_cast<double>(on.parameters) / (1024.0 * 1024.0), 0.01);
  EXPECT_EQ(zero3_moments.host_parameters_mib, 0.0);

  const Held zero1_on = held("offload-memory-zero1-on", zero(1, {kOffload}));
  const Held zero1_off = held("offload-memory-zero1-off", zero(1));
  EXPECT_NEAR(static_cast<double>(zero1_off.device_after - zero1_on.device_after), 4.0 * on.parameters, 64.0);
}

// parallel.offload_params_device_copy at one rank: the device holds the shard as the gathers send
// it (fp32: 4 bytes a parameter; bf16 gathers: 2) beside what it held with the shards alone on the
// host, and the link carries the shard down once at the start and once after the step's update
// instead of at each of the two micro-batches' gathers; the loads' copy of the values to the host
// and the reduced gradients' way back stay: 4P + 2 x 4P down + 2 x 4P up.
TEST_F(DeviceOffloadMemory, ADeviceCopyHoldsTheShardAndCrossesTheLinkOnceAStep) {
  const std::vector<std::string> shards = {"parallel.zero=3", kOffload, kOffloadParams};
  std::vector<std::string> copied = shards;
  copied.push_back(kDeviceCopy);
  ::loom::testing::reset_emulated_census();
  const Held without = held("device-copy-memory-without", shards);
  const int64_t link_without = ::loom::testing::emulated_census().staged_transfer_bytes;
  ::loom::testing::reset_emulated_census();
  const Held with = held("device-copy-memory-with", copied);
  const int64_t link_with = ::loom::testing::emulated_census().staged_transfer_bytes;
  ASSERT_GT(with.parameters, 10000);
  EXPECT_EQ(with.device_after - without.device_after, 4 * with.parameters);
  EXPECT_EQ(with.host_parameters_mib, without.host_parameters_mib);
  EXPECT_EQ(link_with, 20 * with.parameters);
  EXPECT_GE(link_without - link_with, 4 * with.parameters) << link_without;

  std::vector<std::string> compact = {"precision.recipe=bf16", "precision.param_dtype=compute"};
  std::vector<std::string> shards16 = shards, copied16 = copied;
  shards16.insert(shards16.end(), compact.begin(), compact.end());
  copied16.insert(copied16.end(), compact.begin(), compact.end());
  const Held without16 = held("device-copy-memory-without-bf16", shards16);
  const Held with16 = held("device-copy-memory-with-bf16", copied16);
  EXPECT_EQ(with16.device_after - without16.device_after, 2 * with.parameters);
}

// parallel.offload_params: ZeRO-3's parameter and gradient shards in host memory too, the shards
// copied to the device for each gather and the reduced gradients back, the norm, unscaling and
// update on the host: bit for bit the CPU's run at one rank and over dp 2, with parameters
// gathered in bf16, gradients reduced in bf16, fp16's loss scaling (its unscaling on the host), tp 2
// and the experts' own group (ep 2).
TEST_F(DeviceOffload, ShardsInHostMemoryEqualTheCpuBitForBit) {
  const std::vector<std::string> offload = {kOffload, kOffloadParams};
  expect_bitwise_equal_runs(kLlama, "offload-params-one-rank", zero3_rounds({}), offload);
  expect_bitwise_equal_runs(kLlama, "offload-params-dp2", zero3_rounds({"runtime.ranks=2"}), offload);
  expect_bitwise_equal_runs(kLlama, "offload-params-compact",
                            zero3_rounds({"runtime.ranks=2", "precision.recipe=bf16", "precision.param_dtype=compute",
                                   "precision.grad_reduce=bf16"}),
                            offload);
  expect_bitwise_equal_runs(kLlama, "offload-params-fp16", zero3_rounds({"runtime.ranks=2", "precision.recipe=fp16"}),
                            offload);
  expect_bitwise_equal_runs(kLlama, "offload-params-tp2", zero3_rounds({"runtime.ranks=2", "parallel.tp=2"}), offload);
  expect_bitwise_equal_runs(kMoe, "offload-params-ep2", zero3_rounds({"runtime.ranks=2", "parallel.ep=2"}), offload);
}

// parallel.offload_params_device_copy: each gather sends from the device's copy of the shard in the
// gathers' dtype, uploaded after every update and load, instead of from a copy made for it: bit for
// bit the CPU's run at one rank, over dp 2, with bf16 gathers and gradient reduction, under fp16 (its
// skipped steps leave the copy as it is), with evaluations between the steps (a forward over the
// gathered full parameters), and with the experts' own group (ep 2).
TEST_F(DeviceOffload, ADeviceCopyOfTheShardsEqualsTheCpuBitForBit) {
  const std::vector<std::string> offload = {kOffload, kOffloadParams, kDeviceCopy};
  expect_bitwise_equal_runs(kLlama, "device-copy-one-rank", zero3_rounds({}), offload);
  expect_bitwise_equal_runs(kLlama, "device-copy-dp2", zero3_rounds({"runtime.ranks=2"}), offload);
  expect_bitwise_equal_runs(kLlama, "device-copy-compact",
                            zero3_rounds({"runtime.ranks=2", "precision.recipe=bf16", "precision.param_dtype=compute",
                                   "precision.grad_reduce=bf16"}),
                            offload);
  expect_bitwise_equal_runs(kLlama, "device-copy-fp16", zero3_rounds({"runtime.ranks=2", "precision.recipe=fp16"}),
                            offload);
  expect_bitwise_equal_runs(kLlama, "device-copy-eval",
                            zero3_rounds({"runtime.ranks=2", "data.val_prefix=" + root_ + "/data/c_train",
                                   "train.eval_interval=1", "train.eval_batches=1"}),
                            offload);
  const std::vector<double> evaluated = validation_losses(root_, "device-copy-eval-cuda");
  EXPECT_EQ(evaluated.size(), 4u);
  EXPECT_EQ(evaluated, validation_losses(root_, "device-copy-eval-cpu"));
  expect_bitwise_equal_runs(kMoe, "device-copy-ep2", zero3_rounds({"runtime.ranks=2", "parallel.ep=2"}), offload);
}

// The copy is no state of the run: a run stopped at step 2 with it resumes without it, and one
// stopped without it resumes with it (the load uploads the copy), to the uninterrupted run's losses
// and checkpoint.
TEST_F(DeviceOffload, ADeviceCopyOfTheShardsResumesEitherWay) {
  expect_resumes_either_way("device-copy", {kOffload, kOffloadParams}, kDeviceCopy);
}

// Its checkpoints are the same state, written from host memory: a run stopped at step 2 resumes
// with the shards on the device, and one stopped with them there resumes with them on the host.
TEST_F(DeviceOffload, ShardsInHostMemoryResumeEitherWay) {
  expect_resumes_either_way("offload-params", {kOffload}, kOffloadParams);
}

TEST_F(DeviceOffload, OnTheCpuOrAFractionAloneItIsAnErrorNamingTheKeys) {
  auto error_of = [&](const std::string& name, const std::vector<std::string>& overrides) -> std::string {
    try {
      train(name, kLlama, overrides, 1);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("offload-on-cpu", {kOffload}).find("optim.cpu_offload=true needs runtime.device=cuda"),
            std::string::npos);
  const std::string alone = error_of("fraction-alone", {"runtime.device=cuda", "optim.offload_fraction=0.5"});
  EXPECT_NE(alone.find("optim.offload_fraction"), std::string::npos) << alone;
  EXPECT_NE(alone.find("optim.cpu_offload=true"), std::string::npos) << alone;
  const std::string range = error_of("fraction-range", {"runtime.device=cuda", kOffload, "optim.offload_fraction=1.5"});
  EXPECT_NE(range.find("optim.offload_fraction"), std::string::npos) << range;
  // parallel.offload_params: ZeRO-3's shards, updated on the host with all of the optimizer's state.
  const std::string not_zero3 = error_of("params-zero1", {"runtime.device=cuda", kOffload, kOffloadParams});
  EXPECT_NE(not_zero3.find("parallel.offload_params=true"), std::string::npos) << not_zero3;
  EXPECT_NE(not_zero3.find("parallel.zero=3 (it is 0)"), std::string::npos) << not_zero3;
  const std::string alone_params = error_of("params-alone", {"runtime.device=cuda", "parallel.zero=3", kOffloadParams});
  EXPECT_NE(alone_params.find("optim.cpu_offload=true"), std::string::npos) << alone_params;
  const std::string part = error_of("params-fraction", {"runtime.device=cuda", "parallel.zero=3", kOffload,
                                                        kOffloadParams, "optim.offload_fraction=0.5"});
  EXPECT_NE(part.find("optim.offload_fraction at 1"), std::string::npos) << part;
  // parallel.offload_params_device_copy: a copy of what parallel.offload_params moves to the host.
  const std::string copy_alone =
      error_of("copy-alone", {"runtime.device=cuda", "parallel.zero=3", kOffload, kDeviceCopy});
  EXPECT_NE(copy_alone.find("parallel.offload_params_device_copy=true"), std::string::npos) << copy_alone;
  EXPECT_NE(copy_alone.find("set parallel.offload_params=true"), std::string::npos) << copy_alone;
}

}  // namespace
}  // namespace loom::train
