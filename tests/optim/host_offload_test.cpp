// optim.cpu_offload's optimizer (optim/host_offload.h) on the emulated CUDA device: values and
// gradients on the device, moments on the host (or, optim.offload_fraction, some on the device).
// It must update as AdamW does on the device, bit for bit (the emulated device runs the CPU
// kernels), whatever its staging chunk and wherever each piece's moments are, and move each run of
// adjacent pieces in one transfer each way, through the device's transfer staging, the next
// chunk's coming down while the host updates one. The emulated device runs a transfer not waited
// for only when its queue next does something or a fence is waited for, so bytes read or written
// on the host before their fence would show in the results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/optim/adamw.h"
#include "loom/optim/host_offload.h"
#include "loom/optim/moment_arrays.h"
#include "support/emulated_cuda.h"

namespace loom::optim {
namespace {

constexpr Device kGpu = Device::cuda(0);
constexpr int64_t kElements = 64;

std::vector<float> wave(float scale, int shift) {
  std::vector<float> v(kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    v[static_cast<size_t>(i)] = scale * static_cast<float>((i * 29 + shift) % 23 - 11);
  }
  return v;
}

// Adjacent pieces of several kinds ([0, 19)), a gap, then two more ([25, 64)).
struct PieceSpec {
  int64_t offset, numel;
  bool weight_decay;
  float lr_scale;
};
const std::vector<PieceSpec> kPieces = {{0, 5, true, 1.0f}, {5, 13, false, 0.5f}, {18, 1, true, 1.0f},
                                        {25, 20, true, 2.0f}, {45, 19, false, 1.0f}};

struct Trained {
  std::vector<float> values, exp_avg, exp_avg_sq;
};

// Three steps of `optimizer` over the pieces, their moments where `moments` has them (a piece
// whose moments cross from host into device memory is cut there, as the stages cut them).
Trained three_steps(const Optimizer& optimizer, const MomentArrays& moments) {
  DeviceBuffer<float> values(kGpu, kElements), grads(kGpu, kElements);
  const std::vector<float> initial = wave(0.1f, 3);
  copy_from_host(kGpu, values.data(), initial.data(), kElements);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> g = wave(0.01f * static_cast<float>(step), static_cast<int>(step) * 7);
    copy_from_host(kGpu, grads.data(), g.data(), kElements);
    std::vector<ShardPiece> pieces;
    for (const PieceSpec& p : kPieces) {
      for (const MomentArrays::Part& part : moments.parts(p.offset, p.numel)) {
        pieces.push_back({values.data() + part.begin, grads.data() + part.begin, {part.exp_avg, part.exp_avg_sq},
                          part.n, p.weight_decay, p.lr_scale});
        pieces.back().state_on_host = part.on_host;
      }
    }
    optimizer.update_many(pieces, {1e-2, step, 0.75f});
  }
  Trained out{std::vector<float>(kElements), std::vector<float>(kElements), std::vector<float>(kElements)};
  copy_to_host(kGpu, out.values.data(), values.data(), kElements);
  for (const MomentArrays::Part& part : moments.parts(0, kElements)) {
    copy_to_host(part.device, out.exp_avg.data() + part.begin, part.exp_avg, part.n);
    copy_to_host(part.device, out.exp_avg_sq.data() + part.begin, part.exp_avg_sq, part.n);
  }
  return out;
}

config::OptimConfig adamw_config() {
  config::OptimConfig c;
  c.weight_decay = 0.1;
  c.cpu_offload = true;
  return c;
}

HostOffloadedOptimizer offloaded_optimizer(int64_t chunk = kOffloadChunkElements) {
  return HostOffloadedOptimizer(std::make_unique<AdamW>(adamw_config(), Device::cpu()),
                                std::make_unique<AdamW>(adamw_config(), kGpu), kGpu, chunk);
}

TEST(HostOffload, UpdatesAsTheDevicesAdamWBitForBitWhateverItsChunk) {
  ::loom::testing::install_emulated_cuda();
  const AdamW on_device(adamw_config(), kGpu);
  const Trained expected = three_steps(on_device, MomentArrays(kElements, 0, kGpu));
  // 1: every element its own chunk; 7 and 13: pieces split across chunks; 1000: one chunk.
  for (int64_t chunk : {1, 7, 13, 1000}) {
    const HostOffloadedOptimizer offloaded = offloaded_optimizer(chunk);
    EXPECT_FALSE(offloaded.writes_bf16_copies());
    const Trained got = three_steps(offloaded, MomentArrays(kElements, kElements, kGpu));
    EXPECT_EQ(got.values, expected.values) << "chunk " << chunk;
    EXPECT_EQ(got.exp_avg, expected.exp_avg) << "chunk " << chunk;
    EXPECT_EQ(got.exp_avg_sq, expected.exp_avg_sq) << "chunk " << chunk;
  }
}

// One chunk: the three adjacent pieces move as one run and the two after the gap as another, so
// a step copies 2 runs x (gradients, values) down and 2 runs of values up.
TEST(HostOffload, MovesEachRunOfAdjacentPiecesOnce) {
  ::loom::testing::install_emulated_cuda();
  const HostOffloadedOptimizer offloaded = offloaded_optimizer();
  DeviceBuffer<float> values(kGpu, kElements), grads(kGpu, kElements);
  std::vector<float> m(kElements), v(kElements);
  std::vector<ShardPiece> pieces;
  for (const PieceSpec& p : kPieces) {
    pieces.push_back({values.data() + p.offset, grads.data() + p.offset, {m.data() + p.offset, v.data() + p.offset},
                      p.numel, p.weight_decay, p.lr_scale});
    pieces.back().state_on_host = true;
  }
  ::loom::testing::reset_emulated_census();
  offloaded.update_many(pieces, {1e-2, 1, 1.0f});
  const ::loom::testing::EmulatedCensus census = ::loom::testing::emulated_census();
  EXPECT_EQ(census.to_host_async, 4);
  EXPECT_EQ(census.from_host_async, 2);
  EXPECT_EQ(census.to_host + census.from_host, 0) << "no transfer that waits for the device";
  EXPECT_EQ(census.fence_waits, 2);  // the chunk down, then every value back up
  EXPECT_EQ(census.to_host_bytes, 2 * (19 + 39) * 4);
  EXPECT_EQ(census.from_host_bytes, (19 + 39) * 4);
  // All through the device's transfer staging (pinned on a GPU).
  EXPECT_EQ(census.staged_transfer_bytes, census.to_host_bytes + census.from_host_bytes);
}

// AdamW on the host that notes, as it starts each chunk, the transfers queued so far.
class NotingAdamW final : public Optimizer {
 public:
  explicit NotingAdamW(std::vector<std::pair<int64_t, int64_t>>* noted) : adamw_(adamw_config()), noted_(noted) {}
  void update(const ShardPiece& piece, const StepParams& step) const override { update_many({&piece, 1}, step); }
  void update_many(std::span<const ShardPiece> pieces, const StepParams& step) const override {
    const ::loom::testing::EmulatedCensus census = ::loom::testing::emulated_census();
    noted_->emplace_back(census.to_host_async, census.from_host_async);
    adamw_.update_many(pieces, step);
  }

 private:
  AdamW adamw_;
  std::vector<std::pair<int64_t, int64_t>>* noted_;
};

// Four chunks of one piece: when the host starts chunk c, chunk c + 1's gradients and values are
// already on their way down (2 transfers per chunk) and the c chunks before went back up; the
// result is still the device's AdamW's, bit for bit.
TEST(HostOffload, TheNextChunkComesDownWhileTheHostUpdatesOne) {
  ::loom::testing::install_emulated_cuda();
  std::vector<std::pair<int64_t, int64_t>> noted;
  const HostOffloadedOptimizer offloaded(std::make_unique<NotingAdamW>(&noted),
                                         std::make_unique<AdamW>(adamw_config(), kGpu), kGpu, kElements / 4);
  DeviceBuffer<float> values(kGpu, kElements), grads(kGpu, kElements);
  std::vector<float> m(kElements), v(kElements);
  const std::vector<float> initial = wave(0.1f, 3), g = wave(0.01f, 7);
  copy_from_host(kGpu, values.data(), initial.data(), kElements);
  copy_from_host(kGpu, grads.data(), g.data(), kElements);
  ShardPiece whole{values.data(), grads.data(), {m.data(), v.data()}, kElements, true, 1.0f};
  whole.state_on_host = true;
  ::loom::testing::reset_emulated_census();
  offloaded.update_many({&whole, 1}, {1e-2, 1, 0.75f});
  ASSERT_EQ(noted.size(), 4u);
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(noted[static_cast<size_t>(c)].first, 2 * std::min<int64_t>(c + 2, 4)) << "chunk " << c;
    EXPECT_EQ(noted[static_cast<size_t>(c)].second, c) << "chunk " << c;
  }
  EXPECT_EQ(::loom::testing::emulated_census().fence_waits, 5);
  // The values the device's AdamW writes in the same step.
  const AdamW reference(adamw_config(), kGpu);
  DeviceBuffer<float> ref_values(kGpu, kElements), ref_grads(kGpu, kElements), ref_m(kGpu, kElements),
      ref_v(kGpu, kElements);
  copy_from_host(kGpu, ref_values.data(), initial.data(), kElements);
  copy_from_host(kGpu, ref_grads.data(), g.data(), kElements);
  reference.update({ref_values.data(), ref_grads.data(), {ref_m.data(), ref_v.data()}, kElements, true, 1.0f},
                   {1e-2, 1, 0.75f});
  std::vector<float> got(kElements), want(kElements);
  copy_to_host(kGpu, got.data(), values.data(), kElements);
  copy_to_host(kGpu, want.data(), ref_values.data(), kElements);
  EXPECT_EQ(got, want);
}

// optim.offload_fraction: the pieces whose moments are on the device are updated there, the others
// on the host, each as the device's AdamW would (the pieces' moments, here the first 25 elements'
// on the host, the rest on the device, as a stage's MomentArrays hands them out).
TEST(HostOffload, PiecesWithTheirMomentsOnTheDeviceAreUpdatedThere) {
  ::loom::testing::install_emulated_cuda();
  const AdamW on_device(adamw_config(), kGpu);
  const Trained expected = three_steps(on_device, MomentArrays(kElements, 0, kGpu));
  for (int64_t on_host : {int64_t{0}, int64_t{10}, int64_t{25}, kElements}) {
    const Trained got = three_steps(offloaded_optimizer(7), MomentArrays(kElements, on_host, kGpu));
    EXPECT_EQ(got.values, expected.values) << on_host << " on the host";
    EXPECT_EQ(got.exp_avg, expected.exp_avg) << on_host << " on the host";
    EXPECT_EQ(got.exp_avg_sq, expected.exp_avg_sq) << on_host << " on the host";
  }
}

// make_optimizer offloads on a GPU only: on the cpu the state is in host memory already.
TEST(HostOffload, MakeOptimizerOffloadsWhereTheConfigAsksOnAGpu) {
  ::loom::testing::install_emulated_cuda();
  config::OptimConfig c = adamw_config();
  EXPECT_NE(dynamic_cast<HostOffloadedOptimizer*>(make_optimizer(c, kGpu).get()), nullptr);
  EXPECT_EQ(dynamic_cast<HostOffloadedOptimizer*>(make_optimizer(c, Device::cpu()).get()), nullptr);
  c.cpu_offload = false;
  EXPECT_EQ(dynamic_cast<HostOffloadedOptimizer*>(make_optimizer(c, kGpu).get()), nullptr);
}

// How many of a stage's elements have host moments: none on the cpu or without the offload, the
// fraction's share (rounded) with it.
TEST(HostOffload, OffloadedElementsAreTheFractionsShareOnAGpu) {
  config::OptimConfig c = adamw_config();
  EXPECT_EQ(offloaded_elements(c, true, 1000), 1000);
  EXPECT_EQ(offloaded_elements(c, false, 1000), 0);
  c.offload_fraction = 0.25;
  EXPECT_EQ(offloaded_elements(c, true, 1000), 250);
  EXPECT_EQ(offloaded_elements(c, true, 3), 1);
  c.offload_fraction = 0.0;
  EXPECT_EQ(offloaded_elements(c, true, 1000), 0);
  c.cpu_offload = false;
  c.offload_fraction = 1.0;
  EXPECT_EQ(offloaded_elements(c, true, 1000), 0);
}

}  // namespace
}  // namespace loom::optim
