// precision.grad_reduce=bf16 at every ZeRO stage: each rank's gradient is rounded to bf16, the
// ranks' contributions are summed in f32 in rank order and the sum is rounded to bf16 once, then
// widened into the fp32 gradients. GradReducer (ZeRO 0) all-reduces so; DistributedOptimizer
// (ZeRO 1, 2) and Zero3 reduce-scatter so, each rank getting bitwise that value for its shard,
// on awkward sizes (padded buckets and sections, odd counts, an empty section) at dp 2, 3, 4;
// the reduce-scatters put half the bytes of f32 on the (simulated) links.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

#include "loom/comm/reduce.h"
#include "loom/comm/simulated_links.h"
#include "loom/core/error.h"
#include "loom/parallel/data/distributed_optimizer.h"
#include "loom/parallel/data/grad_buckets.h"
#include "loom/parallel/data/zero3.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

using testing::random_values;
using testing::ranges;
using testing::segments;
using testing::threads;
using testing::total;

float through_bf16(float x) { return loom::bf16_to_f32(loom::f32_to_bf16(x)); }

// The serial reference of one bf16 reduction: every rank's value rounded to bf16, summed in f32
// in rank order, the sum rounded to bf16 once.
std::vector<float> bf16_reduction(const std::vector<std::vector<float>>& per_rank) {
  std::vector<float> out(per_rank.front().size());
  for (size_t i = 0; i < out.size(); ++i) {
    float sum = 0.0f;
    for (const std::vector<float>& g : per_rank) sum += through_bf16(g[i]);
    out[i] = through_bf16(sum);
  }
  return out;
}

// The same sum without any bf16 rounding, to show the result really travelled as bf16.
std::vector<float> f32_reduction(const std::vector<std::vector<float>>& per_rank) {
  std::vector<float> out(per_rank.front().size(), 0.0f);
  for (const std::vector<float>& g : per_rank) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += g[i];
  }
  return out;
}

config::OptimConfig optim_config() {
  config::OptimConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.clip_grad = 0.05;  // active for these gradients
  return c;
}

double relative_difference(const std::vector<float>& expected, const float* actual) {
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(expected[i] - actual[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(expected[i])));
  }
  return diff / scale;
}

// Gradients of rank r in reduction round m (a ZeRO-2 round or a ZeRO-3 micro-batch) of a step.
uint64_t grad_seed(int step, int round, int rank) {
  return 900 + 1000 * static_cast<uint64_t>(step) + 17 * static_cast<uint64_t>(round) + rank;
}

// Per round, per rank: the gradients every rank feeds in at `step`.
std::vector<std::vector<std::vector<float>>> all_gradients(int step, int rounds, int ranks, int64_t n) {
  std::vector<std::vector<std::vector<float>>> g(rounds);
  for (int m = 0; m < rounds; ++m) {
    for (int r = 0; r < ranks; ++r) g[m].push_back(random_values(grad_seed(step, m, r), n, 0.01f));
  }
  return g;
}

constexpr int kSteps = 2;  // the second step's reductions must overwrite the first's shards

// What the shards must hold after `rounds` rounds: each round's bf16 reduction, added in f32.
std::vector<float> expected_reduced(const std::vector<std::vector<std::vector<float>>>& g) {
  std::vector<float> sum(g.front().front().size(), 0.0f);
  for (const auto& round : g) {
    const std::vector<float> reduced = bf16_reduction(round);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += reduced[i];
  }
  return sum;
}

TEST(GradReducerBf16, ReducesBucketsInBf16) {
  const auto params = ranges({5, 300, 1, 77, 1024, 3});
  const int64_t n = total(params);
  for (int ranks : {2, 3}) {
    std::mutex mutex;
    int checked = 0;
    comm::launch(threads(ranks), [&](comm::Communicator& world) {
      std::vector<float> grads = random_values(50 + world.rank(), n, 0.01f);
      GradReducer reducer(world, grads.data(), make_buckets(params, 200 * sizeof(float), 1), comm::ReduceOp::Sum,
                          DType::BF16);
      for (int p = static_cast<int>(params.size()) - 1; p >= 0; --p) reducer.mark_ready(p);
      reducer.finish();
      std::vector<std::vector<float>> all;
      for (int r = 0; r < ranks; ++r) all.push_back(random_values(50 + r, n, 0.01f));
      int64_t differs_from_f32 = 0;
      for (int64_t i = 0; i < n; ++i) {
        float sum = 0.0f, sum_f32 = 0.0f;
        for (int r = 0; r < ranks; ++r) {
          const float v = all[r][i];
          sum += loom::bf16_to_f32(loom::f32_to_bf16(v));
          sum_f32 += v;
        }
        const float expected = loom::bf16_to_f32(loom::f32_to_bf16(sum));
        ASSERT_EQ(grads[i], expected) << "rank " << world.rank() << " element " << i;
        differs_from_f32 += grads[i] != sum_f32;
      }
      EXPECT_GT(differs_from_f32, n / 2);  // it really travelled as bf16
      std::lock_guard<std::mutex> lock(mutex);
      ++checked;
    });
    EXPECT_EQ(checked, ranks);
  }
}

TEST(GradReducerBf16, OnlyF32OrBf16) {
  comm::launch(threads(1), [&](comm::Communicator& world) {
    std::vector<float> grads(4);
    EXPECT_THROW(GradReducer(world, grads.data(), make_buckets(ranges({4}), 16, 1), comm::ReduceOp::Sum, DType::I32),
                 Error);
  });
}

// ---- ZeRO 1 and 2: DistributedOptimizer's bucket reduce-scatters ----

// 257 and 101 are primes; 0 and 1 are edge cases; nothing is a multiple of 3 or 4.
const std::vector<int64_t> kSizes = {101, 7, 1, 257, 30, 13, 64, 3, 0, 19};

struct ShardedCase {
  int ranks = 2;
  int zero = 1;
  int64_t bucket_bytes = 200;  // 50 elements: buckets padded for every dp tried
  int rounds = 1;
  int comm_buffers = 2;
};

void expect_bf16_shards(const ShardedCase& c) {
  SCOPED_TRACE("dp " + std::to_string(c.ranks) + ", zero " + std::to_string(c.zero) + ", bucket_bytes " +
               std::to_string(c.bucket_bytes) + ", rounds " + std::to_string(c.rounds) + ", comm_buffers " +
               std::to_string(c.comm_buffers));
  const auto params = ranges(kSizes);
  const int64_t n = total(params);
  const std::vector<float> initial = random_values(7, n, 0.5f);
  // Per step: the gradients, the serial reference's reduced gradients, the unsharded AdamW step.
  std::vector<std::vector<std::vector<std::vector<float>>>> g;
  std::vector<std::vector<float>> expected, unrounded;
  std::vector<double> reference_norms;
  std::vector<float> reference = initial;
  optim::AdamW adamw(optim_config(), n, segments(params));
  for (int step = 1; step <= kSteps; ++step) {
    g.push_back(all_gradients(step, c.rounds, c.ranks, n));
    expected.push_back(expected_reduced(g.back()));
    unrounded.push_back(f32_reduction(g.back().front()));
    std::vector<float> grads = expected.back();
    reference_norms.push_back(adamw.step(reference.data(), grads.data(), optim_config().lr, step));
  }
  std::mutex mutex;
  int64_t checked = 0, differs_from_f32 = 0;
  comm::launch(threads(c.ranks), [&](comm::Communicator& world) {
    std::vector<float> values = initial, grads(static_cast<size_t>(n));
    DistributedOptimizerOptions options;
    options.zero = c.zero;
    options.wire = DType::BF16;
    options.comm_buffers = c.comm_buffers;
    DistributedOptimizer opt(world, make_buckets(params, c.bucket_bytes, c.ranks), segments(params), optim_config(),
                             values.data(), grads.data(), options);
    int64_t mine = 0, differs = 0;
    for (int step = 1; step <= kSteps; ++step) {
      const auto& rounds = g[step - 1];
      for (const auto& round : rounds) {
        std::copy(round[world.rank()].begin(), round[world.rank()].end(), grads.begin());
        for (int p = static_cast<int>(params.size()) - 1; p >= 0; --p) opt.mark_ready(p);
        opt.finish_grads();
        // ZeRO-2: the full buffer is free after a round; ZeRO-1's holds the reduced shards.
        if (c.zero == 2) std::fill(grads.begin(), grads.end(), 0.0f);
      }
      for (const OwnedShard& shard : opt.shards()) {
        for (int64_t i = shard.begin; i < shard.end; ++i) {
          ASSERT_EQ(shard.grad[i - shard.begin], expected[step - 1][i])
              << "rank " << world.rank() << " step " << step << " element " << i;
          differs += shard.grad[i - shard.begin] != unrounded[step - 1][i];
          ++mine;
        }
      }
      // The step on these gradients is the unsharded step (up to the norm's summation order).
      const double norm = opt.step(optim_config().lr, step);
      EXPECT_NEAR(norm, reference_norms[step - 1], 1e-5 * reference_norms[step - 1]) << "step " << step;
    }
    EXPECT_LE(relative_difference(reference, values.data()), 1e-6);
    std::lock_guard<std::mutex> lock(mutex);
    checked += mine;
    differs_from_f32 += differs;
  });
  EXPECT_EQ(checked, kSteps * n);  // the shards tile the buffer: every element was compared
  if (c.rounds == 1) {
    EXPECT_GT(differs_from_f32, kSteps * n / 2);  // it really travelled as bf16
  }
}

TEST(DistributedOptimizerBf16, Zero1ReduceScattersInBf16) {
  for (int ranks : {2, 3, 4}) {
    for (int64_t bucket_bytes : {int64_t{4}, int64_t{200}, int64_t{1} << 20}) {
      expect_bf16_shards({.ranks = ranks, .zero = 1, .bucket_bytes = bucket_bytes});
    }
  }
  expect_bf16_shards({.ranks = 3, .zero = 1, .bucket_bytes = 60, .comm_buffers = 1});
}

TEST(DistributedOptimizerBf16, Zero2AddsEachRoundsBf16ReductionInF32) {
  for (int ranks : {2, 3, 4}) {
    expect_bf16_shards({.ranks = ranks, .zero = 2, .bucket_bytes = 200});
    expect_bf16_shards({.ranks = ranks, .zero = 2, .bucket_bytes = 200, .rounds = 3});
  }
  expect_bf16_shards({.ranks = 4, .zero = 2, .bucket_bytes = 60, .rounds = 2, .comm_buffers = 1});
}

// Bytes the ranks send to each other during one round of reduce-scatters (the simulated links
// count them; without latency or bandwidth they add no delay), and the staging each rank holds.
struct Traffic {
  int64_t bytes = 0;
  int64_t staging = 0;  // allocation().comm_buffers, in 4-byte units
};

Traffic sharded_traffic(int ranks, DType wire) {
  const auto params = ranges(kSizes);
  const int64_t n = total(params);
  auto links = std::make_shared<comm::SimulatedLinks>(comm::topology_from_blocks(ranks, ranks, 0), comm::LinkSpecs{});
  comm::LaunchOptions launch = threads(ranks);
  launch.link_model = links;
  Traffic t;
  std::mutex mutex;
  comm::launch(launch, [&](comm::Communicator& world) {
    std::vector<float> values(static_cast<size_t>(n), 0.5f);
    std::vector<float> grads = random_values(grad_seed(1, 0, world.rank()), n, 0.01f);
    DistributedOptimizerOptions options;
    options.wire = wire;
    DistributedOptimizer opt(world, make_buckets(params, 200, ranks), segments(params), optim_config(), values.data(),
                             grads.data(), options);
    opt.finish_grads();  // the reduce-scatters only: no step, so no parameter all-gather
    std::lock_guard<std::mutex> lock(mutex);
    t.staging = opt.allocation().comm_buffers;
  });
  t.bytes = links->bytes(comm::LinkClass::SameNode);
  return t;
}

TEST(DistributedOptimizerBf16, HalvesTheBytesOnTheWire) {
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE("dp " + std::to_string(ranks));
    // Each rank receives every other rank's block of each bucket: dp (dp - 1) shard elements.
    int64_t elements = 0;
    for (const Bucket& b : make_buckets(ranges(kSizes), 200, ranks).buckets) {
      if (b.numel > 0) elements += static_cast<int64_t>(ranks) * (ranks - 1) * b.shard_numel;
    }
    const Traffic f32 = sharded_traffic(ranks, DType::F32), bf16 = sharded_traffic(ranks, DType::BF16);
    EXPECT_EQ(f32.bytes, 4 * elements);
    EXPECT_EQ(bf16.bytes, 2 * elements);
    EXPECT_EQ(2 * bf16.staging, f32.staging);  // the staging buffers are bf16 too
  }
}

// ---- ZeRO 3: Zero3's per-unit reduce-scatters ----

// Units over awkward parameters: unit 4 reads the tied parameter 0 as the head reads the
// embedding, and unit 6 reads only parameter 0, so its own section is empty.
struct Units {
  std::vector<ParamRange> params = ranges({101, 7, 1, 257, 30, 13, 64, 3, 19, 5});
  std::vector<std::vector<int>> unit_params = {{0, 1}, {2, 3}, {4}, {5, 6, 7}, {8, 0}, {9}, {0}};
  int count() const { return static_cast<int>(unit_params.size()); }
};

// Drives the model hooks as a forward and backward would; a unit's backward writes its own
// section's gradient (what this rank computed for micro-batch `m`).
void zero3_micro_batch(Zero3& zero3, float* grads, const std::vector<float>& g, const Units& units) {
  zero3.begin_micro_batch();
  for (int u = 0; u < units.count(); ++u) {
    zero3.before_forward(u);
    zero3.after_forward(u);
  }
  for (int u = units.count() - 1; u >= 0; --u) {
    zero3.before_backward(u);
    const FlatRange section = zero3.section_range(u);
    std::copy(g.begin() + section.begin, g.begin() + section.end, grads + section.begin);
    zero3.after_backward(u);
  }
  zero3.end_micro_batch();
}

TEST(Zero3Bf16, ReduceScattersEachUnitInBf16) {
  const Units units;
  const int64_t n = total(units.params);
  const std::vector<optim::Segment> segs = segments(units.params);
  const std::vector<float> initial = random_values(11, n, 0.5f);
  for (int ranks : {2, 3, 4}) {
    for (int micro_batches : {1, 2}) {
      SCOPED_TRACE("dp " + std::to_string(ranks) + ", micro-batches " + std::to_string(micro_batches));
      std::vector<std::vector<std::vector<std::vector<float>>>> g;
      std::vector<std::vector<float>> expected, unrounded;
      std::vector<double> reference_norms;
      std::vector<float> reference = initial;
      optim::AdamW adamw(optim_config(), n, segs);
      for (int step = 1; step <= kSteps; ++step) {
        g.push_back(all_gradients(step, micro_batches, ranks, n));
        expected.push_back(expected_reduced(g.back()));
        unrounded.push_back(f32_reduction(g.back().front()));
        std::vector<float> grads = expected.back();
        reference_norms.push_back(adamw.step(reference.data(), grads.data(), optim_config().lr, step));
      }
      std::mutex mutex;
      int64_t checked = 0, differs_from_f32 = 0;
      comm::launch(threads(ranks), [&](comm::Communicator& dp) {
        std::vector<float> values = initial, grads(static_cast<size_t>(n));
        Zero3Options options;
        options.wire = DType::BF16;
        Zero3 zero3(dp, values.data(), grads.data(), units.params, units.unit_params, segs, optim_config(), options);
        int64_t mine = 0, differs = 0;
        for (int step = 1; step <= kSteps; ++step) {
          for (const auto& micro_batch : g[step - 1]) zero3_micro_batch(zero3, grads.data(), micro_batch[dp.rank()], units);
          // The padded shards back to back, section by section: real elements match the serial
          // reference bitwise, the padding stays zero.
          const float* reduced = zero3.reduced_gradients();
          int64_t at = 0;
          for (int s = 0; s < zero3.sections(); ++s) {
            const FlatRange section = zero3.section_range(s);
            const int64_t shard = (section.size() + ranks - 1) / ranks;
            for (int64_t j = 0; j < shard; ++j, ++at) {
              const int64_t i = section.begin + dp.rank() * shard + j;
              if (i < section.end) {
                ASSERT_EQ(reduced[at], expected[step - 1][i])
                    << "rank " << dp.rank() << " step " << step << " section " << s << " element " << i;
                differs += reduced[at] != unrounded[step - 1][i];
                ++mine;
              } else {
                ASSERT_EQ(reduced[at], 0.0f) << "padding of section " << s;
              }
            }
          }
          EXPECT_EQ(at, zero3.reduced_gradients_numel());
          const double norm = zero3.step(optim_config().lr, step);
          EXPECT_NEAR(norm, reference_norms[step - 1], 1e-5 * reference_norms[step - 1]) << "step " << step;
        }
        zero3.gather_full_parameters();
        EXPECT_LE(relative_difference(reference, values.data()), 1e-6);
        zero3.release_full_parameters();
        std::lock_guard<std::mutex> lock(mutex);
        checked += mine;
        differs_from_f32 += differs;
      });
      EXPECT_EQ(checked, kSteps * n);
      if (micro_batches == 1) {
        EXPECT_GT(differs_from_f32, kSteps * n / 2);  // it really travelled as bf16
      }
    }
  }
}

// Bytes of one micro-batch (parameter gathers, fp32 either way, and gradient reduce-scatters)
// and the staging bytes of one rank.
Traffic zero3_traffic(int ranks, DType wire) {
  const Units units;
  const int64_t n = total(units.params);
  auto links = std::make_shared<comm::SimulatedLinks>(comm::topology_from_blocks(ranks, ranks, 0), comm::LinkSpecs{});
  comm::LaunchOptions launch = threads(ranks);
  launch.link_model = links;
  Traffic t;
  std::mutex mutex;
  comm::launch(launch, [&](comm::Communicator& dp) {
    std::vector<float> values(static_cast<size_t>(n), 0.5f), grads(static_cast<size_t>(n));
    Zero3Options options;
    options.wire = wire;
    Zero3 zero3(dp, values.data(), grads.data(), units.params, units.unit_params, segments(units.params),
                optim_config(), options);
    zero3_micro_batch(zero3, grads.data(), random_values(grad_seed(1, 0, dp.rank()), n, 0.01f), units);
    std::lock_guard<std::mutex> lock(mutex);
    t.staging = zero3.memory().comm_buffers;
  });
  t.bytes = links->bytes(comm::LinkClass::SameNode);
  return t;
}

TEST(Zero3Bf16, HalvesTheGradientBytesOnTheWire) {
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE("dp " + std::to_string(ranks));
    // The reduce-scatters of one micro-batch in f32: dp (dp - 1) shard elements per section.
    const Units units;
    int64_t elements = 0;
    for (int u = 0; u < units.count(); ++u) {
      int64_t numel = 0;
      for (size_t id = 0; id < units.params.size(); ++id) {
        // A parameter's section is the lowest unit reading it.
        int lowest = units.count();
        for (int v = 0; v < units.count(); ++v) {
          const auto& ids = units.unit_params[v];
          if (std::find(ids.begin(), ids.end(), static_cast<int>(id)) != ids.end()) lowest = std::min(lowest, v);
        }
        if (lowest == u) numel += units.params[id].numel;
      }
      if (numel > 0) elements += static_cast<int64_t>(ranks) * (ranks - 1) * ((numel + ranks - 1) / ranks);
    }
    const Traffic f32 = zero3_traffic(ranks, DType::F32), bf16 = zero3_traffic(ranks, DType::BF16);
    // The gathers are the same either way; the gradients save half their f32 bytes.
    EXPECT_EQ(f32.bytes - bf16.bytes, 2 * elements);
    EXPECT_GT(bf16.bytes, 0);
    EXPECT_EQ(2 * bf16.staging, f32.staging);
  }
}

// precision.param_dtype=compute: the updated shards travel as bf16, and every rank's parameters
// are the unsharded AdamW step's fp32 result rounded to bf16 (the master weights stay fp32), for
// half the bytes of an fp32 gather.
TEST(DistributedOptimizerBf16, GathersParametersInTheComputeDtype) {
  const auto params = ranges(kSizes);
  const int64_t n = total(params);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE("dp " + std::to_string(ranks));
    int64_t bytes[2] = {0, 0};
    for (DType gather : {DType::F32, DType::BF16}) {
      auto links = std::make_shared<comm::SimulatedLinks>(comm::topology_from_blocks(ranks, ranks, 0), comm::LinkSpecs{});
      comm::LaunchOptions launch = threads(ranks);
      launch.link_model = links;
      std::vector<float> initial = random_values(99, n, 1.0f);
      std::vector<std::vector<float>> grads_by_rank;
      for (int r = 0; r < ranks; ++r) grads_by_rank.push_back(random_values(grad_seed(1, 0, r), n, 0.01f));
      // The unsharded reference: AdamW on the summed gradients, in fp32.
      std::vector<float> expected = initial;
      optim::AdamW reference(optim_config(), n, segments(params));
      reference.step(expected.data(), f32_reduction(grads_by_rank).data(), 1e-2, 1);
      std::mutex mutex;
      comm::launch(launch, [&](comm::Communicator& world) {
        std::vector<float> values = initial;
        std::vector<float> grads = grads_by_rank[world.rank()];
        DistributedOptimizerOptions options;
        options.param_gather = gather;
        DistributedOptimizer opt(world, make_buckets(params, 200, ranks), segments(params), optim_config(),
                                 values.data(), grads.data(), options);
        opt.finish_grads();
        opt.step(1e-2, 1);
        std::lock_guard<std::mutex> lock(mutex);
        for (int64_t i = 0; i < n; ++i) {
          const float want = gather == DType::F32 ? expected[i] : loom::bf16_to_f32(loom::f32_to_bf16(expected[i]));
          ASSERT_NEAR(values[i], want, 1e-6f * std::max(1.0f, std::fabs(want))) << "rank " << world.rank() << " element " << i;
        }
      });
      bytes[gather == DType::F32 ? 0 : 1] = links->bytes(comm::LinkClass::SameNode);
    }
    // The same reduce-scatter; the all-gather of the n parameters (each shard to the other
    // ranks: (dp - 1) n elements in all) in 2 bytes instead of 4.
    EXPECT_EQ(bytes[0] - bytes[1], static_cast<int64_t>(ranks - 1) * n * 2);
  }
}

TEST(ZeroBf16, OnlyF32OrBf16OnTheWire) {
  const Units units;
  comm::launch(threads(2), [&](comm::Communicator& world) {
    const int64_t n = total(units.params);
    std::vector<float> values(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
    DistributedOptimizerOptions sharded;
    sharded.wire = DType::F16;
    EXPECT_THROW(DistributedOptimizer(world, make_buckets(units.params, 200, 2), segments(units.params),
                                      optim_config(), values.data(), grads.data(), sharded),
                 Error);
    Zero3Options zero3;
    zero3.wire = DType::I32;
    EXPECT_THROW(Zero3(world, values.data(), grads.data(), units.params, units.unit_params, segments(units.params),
                       optim_config(), zero3),
                 Error);
  });
}

}  // namespace
}  // namespace loom::parallel
