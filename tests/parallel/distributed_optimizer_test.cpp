// ZeRO-1/2 against the unsharded optimizer: several clipped AdamW steps on random gradients for
// dp 1..4, awkward parameter and bucket sizes, must give the parameters optim::AdamW gives on the
// summed gradients; the optimizer state per rank is ~1/dp; the shards tile the buffer for
// checkpoints; the norm spans extra groups; misuse is an Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>

#include "loom/core/error.h"
#include "loom/parallel/data/distributed_optimizer.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

using testing::random_values;
using testing::ranges;
using testing::segments;
using testing::threads;
using testing::total;

// 257 and 101 are primes; 0 and 1 are edge cases; nothing is a multiple of 3.
const std::vector<int64_t> kSizes = {101, 7, 1, 257, 30, 13, 64, 3, 0, 19};

config::OptimConfig config() {
  config::OptimConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.clip_grad = 1.0;  // random gradients of this size have norm ~20-50: clipping is active
  return c;
}

uint64_t grad_seed(int step, int round, int rank) { return 5000 + 1000 * static_cast<uint64_t>(step) + 10 * round + rank; }

struct Setup {
  int ranks = 2;
  int zero = 1;
  int64_t bucket_bytes = 200;  // 50 elements: splits the layout between parameters awkwardly
  int steps = 4;
  int rounds = 1;              // reduction rounds per step (ZeRO-2 may reduce per micro-batch)
  int comm_buffers = 2;
  bool shuffled_marks = false;
  bool overlap_param_gather = false;  // each parameter awaited alone, in forward order, after the step
};

struct Result {
  double max_param_error = 0.0;  // |p - ref| / max(|ref|, 1e-2), worst over ranks and steps
  double max_norm_error = 0.0;   // relative
  std::vector<int64_t> master_elements;  // per rank
  std::vector<int64_t> moment_elements;
  std::vector<FlatRange> owned;  // every rank's shards
  bool master_matches_params = true;
  bool slices_cover_shards = true;
};

Result run_zero(const Setup& s) {
  const auto params = ranges(kSizes);
  const int64_t n = total(params);
  const config::OptimConfig c = config();
  const std::vector<float> init = random_values(7, n, 0.5f);
  std::mutex mutex;
  Result result;
  result.master_elements.resize(s.ranks);
  result.moment_elements.resize(s.ranks);
  comm::launch(threads(s.ranks), [&](comm::Communicator& world) {
    std::vector<float> values = init, grads(static_cast<size_t>(n));
    DistributedOptimizerOptions options;
    options.zero = s.zero;
    options.comm_buffers = s.comm_buffers;
    options.overlap_param_gather = s.overlap_param_gather;
    DistributedOptimizer opt(world, make_buckets(params, s.bucket_bytes, s.ranks), segments(params), c, values.data(),
                             grads.data(), options);
    std::vector<float> reference = init;
    optim::AdamW adamw(c, n, segments(params));
    std::mt19937 rng(31 + world.rank());
    double param_error = 0.0, norm_error = 0.0;
    for (int step = 1; step <= s.steps; ++step) {
      std::vector<double> summed(static_cast<size_t>(n), 0.0);
      for (int round = 0; round < s.rounds; ++round) {
        const std::vector<float> fresh = random_values(grad_seed(step, round, world.rank()), n);
        std::copy(fresh.begin(), fresh.end(), grads.begin());  // the reducer keeps a pointer into grads
        std::vector<int> marks;
        for (int p = static_cast<int>(params.size()) - 1; p >= 0; --p) marks.push_back(p);
        if (s.shuffled_marks) std::shuffle(marks.begin(), marks.end(), rng);
        for (int p : marks) opt.mark_ready(p);
        opt.finish_grads();
        // ZeRO-2: the full buffer is free after the round. ZeRO-1's lives through the step (its
        // reduced shards are written back into it).
        if (s.zero == 2) std::fill(grads.begin(), grads.end(), 0.0f);
        for (int r = 0; r < s.ranks; ++r) {
          const std::vector<float> g = random_values(grad_seed(step, round, r), n);
          for (int64_t i = 0; i < n; ++i) summed[i] += g[i];
        }
      }
      std::vector<float> reduced(summed.begin(), summed.end());
      const double expected_norm = adamw.step(reference.data(), reduced.data(), c.lr, step);
      const double norm = opt.step(c.lr, step);
      if (s.overlap_param_gather) {
        for (const ParamRange& p : params) opt.wait_for_parameters({p.offset, p.offset + p.numel});
        EXPECT_EQ(opt.parameter_gathers_in_flight(), 0);
      }
      norm_error = std::max(norm_error, std::abs(norm - expected_norm) / expected_norm);
      for (int64_t i = 0; i < n; ++i) {
        param_error = std::max(
            param_error, std::abs(static_cast<double>(values[i]) - reference[i]) / std::max(std::abs(reference[i]), 1e-2f));
      }
    }
    const ShardAllocation a = opt.allocation();
    bool matches = true, covered = true;
    std::vector<FlatRange> owned;
    for (const OwnedShard& shard : opt.shards()) {
      owned.push_back({shard.begin, shard.end});
      for (int64_t i = shard.begin; i < shard.end; ++i) matches = matches && shard.master[i - shard.begin] == values[i];
      int64_t sliced = 0;
      for (const ParamSlice& slice : param_slices(opt.layout().params, {shard.begin, shard.end})) {
        sliced += slice.end - slice.begin;
        covered = covered && params[slice.param].offset + slice.begin >= shard.begin &&
                  params[slice.param].offset + slice.end <= shard.end;
      }
      covered = covered && sliced == shard.end - shard.begin;
    }
    std::lock_guard lock(mutex);
    result.max_param_error = std::max(result.max_param_error, param_error);
    result.max_norm_error = std::max(result.max_norm_error, norm_error);
    result.master_elements[world.rank()] = a.master;
    result.moment_elements[world.rank()] = a.moments;
    result.owned.insert(result.owned.end(), owned.begin(), owned.end());
    result.master_matches_params = result.master_matches_params && matches;
    result.slices_cover_shards = result.slices_cover_shards && covered;
  });
  return result;
}

void expect_equivalent(const Setup& s) {
  SCOPED_TRACE("dp " + std::to_string(s.ranks) + ", zero " + std::to_string(s.zero) + ", bucket_bytes " +
               std::to_string(s.bucket_bytes) + ", rounds " + std::to_string(s.rounds));
  const Result r = run_zero(s);
  EXPECT_LE(r.max_param_error, 1e-6);
  EXPECT_LE(r.max_norm_error, 1e-5);
  EXPECT_TRUE(r.master_matches_params);
  EXPECT_TRUE(r.slices_cover_shards);
}

TEST(DistributedOptimizer, Zero1EqualsUnshardedAdamW) {
  for (int ranks : {1, 2, 3, 4}) {
    for (int64_t bucket_bytes : {int64_t{4}, int64_t{200}, int64_t{1} << 20}) {
      expect_equivalent({.ranks = ranks, .zero = 1, .bucket_bytes = bucket_bytes});
    }
  }
}

TEST(DistributedOptimizer, Zero2EqualsUnshardedAdamW) {
  for (int ranks : {1, 2, 3, 4}) expect_equivalent({.ranks = ranks, .zero = 2, .bucket_bytes = 200});
}

TEST(DistributedOptimizer, Zero2AccumulatesRoundsPerMicroBatch) {
  // Three micro-batches reduced one by one, the full gradient buffer zeroed after each: the
  // same step as one reduction of the accumulated gradients.
  for (int ranks : {2, 3}) expect_equivalent({.ranks = ranks, .zero = 2, .bucket_bytes = 200, .steps = 3, .rounds = 3});
}

TEST(DistributedOptimizer, OneCommBufferAndOutOfOrderMarks) {
  // One staging buffer: every launch waits for the previous bucket. Marks in a different random
  // order on every rank: the buckets still launch in bucket order.
  expect_equivalent({.ranks = 4, .zero = 1, .bucket_bytes = 60, .comm_buffers = 1, .shuffled_marks = true});
  expect_equivalent({.ranks = 3, .zero = 2, .bucket_bytes = 60, .rounds = 2, .comm_buffers = 1, .shuffled_marks = true});
}

TEST(DistributedOptimizer, StateIsShardedAcrossRanks) {
  const int64_t n = total(ranges(kSizes));
  for (int ranks : {1, 2, 3, 4}) {
    const int64_t buckets = static_cast<int64_t>(make_buckets(ranges(kSizes), 200, ranks).buckets.size());
    const Result r = run_zero({.ranks = ranks, .zero = 1, .bucket_bytes = 200, .steps = 1});
    int64_t sum = 0;
    for (int k = 0; k < ranks; ++k) {
      EXPECT_LE(r.master_elements[k], n / ranks + buckets) << "rank " << k << " of " << ranks;
      EXPECT_EQ(r.moment_elements[k], 2 * r.master_elements[k]);
      sum += r.master_elements[k];
    }
    EXPECT_EQ(sum, n);  // every element has exactly one owner
    // The owned shards tile the flat buffer.
    std::vector<FlatRange> owned = r.owned;
    std::sort(owned.begin(), owned.end(), [](FlatRange a, FlatRange b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (FlatRange f : owned) {
      EXPECT_EQ(f.begin, at);
      at = f.end;
    }
    EXPECT_EQ(at, n);
  }
}

TEST(DistributedOptimizer, NormSpansExtraGroups) {
  // World of 4 = dp 2 x tp 2 (tp fastest). Each tp rank holds different parameters; the norm is
  // over all of them: the sum over tp of the dp-reduced squared norms.
  const auto params = ranges({37, 5, 61});
  const int64_t n = total(params);
  std::mutex mutex;
  std::vector<double> norms(4);
  comm::launch(threads(4), [&](comm::Communicator& world) {
    const int tp_rank = world.rank() % 2, dp_rank = world.rank() / 2;
    auto dp = world.split(tp_rank, dp_rank, "dp-" + std::to_string(tp_rank));
    auto tp = world.split(dp_rank, tp_rank, "tp-" + std::to_string(dp_rank));
    std::vector<float> values = random_values(3 + tp_rank, n);
    std::vector<float> grads = random_values(grad_seed(1, tp_rank, dp_rank), n);
    DistributedOptimizerOptions options;
    options.norm_groups = {tp.get()};
    DistributedOptimizer opt(*dp, make_buckets(params, 64, 2), segments(params), config(), values.data(),
                             grads.data(), options);
    opt.finish_grads();
    const double norm = opt.step(1e-3, 1);
    std::lock_guard lock(mutex);
    norms[world.rank()] = norm;
  });
  double squares = 0.0;
  for (int t = 0; t < 2; ++t) {
    const auto a = random_values(grad_seed(1, t, 0), n), b = random_values(grad_seed(1, t, 1), n);
    for (int64_t i = 0; i < n; ++i) {
      const float sum = a[i] + b[i];
      squares += static_cast<double>(sum) * sum;
    }
  }
  for (double norm : norms) EXPECT_NEAR(norm, std::sqrt(squares), 1e-5 * std::sqrt(squares));
}

TEST(DistributedOptimizer, RejectsMisuse) {
  const auto params = ranges({10, 3});
  comm::launch(threads(2), [&](comm::Communicator& world) {
    std::vector<float> values(13, 1.0f), grads(13, 1.0f);
    auto make = [&](int zero, int shard_ranks) {
      DistributedOptimizerOptions options;
      options.zero = zero;
      return std::make_unique<DistributedOptimizer>(world, make_buckets(params, 16, shard_ranks), segments(params),
                                                    config(), values.data(), grads.data(), options);
    };
    EXPECT_THROW(make(0, 2), Error);
    EXPECT_THROW(make(3, 2), Error);
    EXPECT_THROW(make(1, 3), Error);  // layout for a different dp size
    auto zero1 = make(1, 2);
    EXPECT_THROW(zero1->step(1e-3, 1), Error);  // nothing reduced yet
    zero1->finish_grads();
    EXPECT_THROW(zero1->finish_grads(), Error);  // ZeRO-1 reduces once per step
    EXPECT_THROW(zero1->mark_ready(0), Error);
    zero1->step(1e-3, 1);
    zero1->mark_ready(1);
    EXPECT_THROW(zero1->mark_ready(1), Error);  // twice in a round
    zero1->finish_grads();
    zero1->step(1e-3, 2);
  });
}

TEST(DistributedOptimizer, ReportsOverlap) {
  const auto params = ranges({2048, 2048, 2048});
  comm::launch(threads(2), [&](comm::Communicator& world) {
    std::vector<float> values(3 * 2048, 0.5f), grads(3 * 2048, 1.0f);
    DistributedOptimizer opt(world, make_buckets(params, 2048 * 4, 2), segments(params), config(), values.data(),
                             grads.data());
    for (int p = 2; p >= 0; --p) opt.mark_ready(p);
    EXPECT_EQ(opt.launched_buckets(), 3);  // each parameter is a bucket; all started before finish
    opt.finish_grads();
    const OverlapStats s = opt.last_stats();
    EXPECT_EQ(s.rounds, 1);
    EXPECT_GE(s.blocked_s, 0.0);
    EXPECT_LE(s.blocked_s, s.window_s);
    EXPECT_GE(s.hidden_fraction(), 0.0);
    EXPECT_LE(s.hidden_fraction(), 1.0);
    for (const OwnedShard& shard : opt.shards()) {
      for (int64_t i = 0; i < shard.end - shard.begin; ++i) ASSERT_FLOAT_EQ(shard.grad[i], 2.0f);
    }
    opt.step(1e-3, 1);
    EXPECT_EQ(opt.total_stats().rounds, 1);
  });
}

TEST(DistributedOptimizer, OverlappedGathersEqualUnshardedAdamW) {
  for (int zero : {1, 2}) {
    for (int ranks : {1, 2, 3, 4}) {
      expect_equivalent({.ranks = ranks, .zero = zero, .rounds = zero, .overlap_param_gather = true});
    }
  }
}

// Holds back every transfer of at least kGated bytes while closed (the norm's 8-byte shares
// pass), for at most 10 s: then it opens by itself and says so (a test waiting for a transfer it
// holds fails instead of hanging).
class GatedLinks : public comm::LinkModel {
 public:
  static constexpr int64_t kGated = 1024;
  void transfer(int, int, int64_t bytes) override {
    if (bytes < kGated) return;
    std::unique_lock lock(mutex_);
    if (!opened_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; })) {
      open_ = true;
      timed_out_ = true;
      opened_.notify_all();
    }
  }
  void set_open(bool open) {
    std::lock_guard lock(mutex_);
    open_ = open;
    opened_.notify_all();
  }
  bool timed_out() {
    std::lock_guard lock(mutex_);
    return timed_out_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = true, timed_out_ = false;
};

// With overlap_param_gather the step returns while its gathers are held back on the links, the
// other rank's shards of the parameters still hold their old values, and the data-parallel group
// stays free (a barrier passes: the gathers run on a group of their own). Awaiting the first
// parameter finishes its bucket alone; awaiting them all gives the updated parameters.
TEST(DistributedOptimizer, OverlappedGathersStayInFlightUntilAwaited) {
  const auto params = ranges({2048, 2048, 2048});
  auto links = std::make_shared<GatedLinks>();
  comm::LaunchOptions launch = threads(2);
  launch.link_model = links;
  comm::launch(launch, [&](comm::Communicator& world) {
    std::vector<float> values(3 * 2048, 0.5f), grads(3 * 2048, 1.0f);
    DistributedOptimizerOptions options;
    options.overlap_param_gather = true;
    DistributedOptimizer opt(world, make_buckets(params, 2048 * 4, 2), segments(params), config(), values.data(),
                             grads.data(), options);
    for (int p = 2; p >= 0; --p) opt.mark_ready(p);
    opt.finish_grads();
    world.barrier();
    if (world.rank() == 0) links->set_open(false);
    world.barrier();
    opt.step(1e-3, 1);
    EXPECT_EQ(opt.parameter_gathers_in_flight(), 3);
    std::vector<FlatRange> others;  // the other rank's shards: not gathered yet
    for (const Bucket& b : opt.layout().buckets) others.push_back(b.shards[1 - world.rank()]);
    for (const FlatRange& r : others) {
      for (int64_t i = r.begin; i < r.end; ++i) ASSERT_EQ(values[i], 0.5f) << i;
    }
    world.barrier();  // passes while the gathers are held: they are not on this group
    EXPECT_FALSE(links->timed_out());
    if (world.rank() == 0) links->set_open(true);
    opt.wait_for_parameters({0, 2048});  // parameter 0: the last bucket
    EXPECT_EQ(opt.parameter_gathers_in_flight(), 2);
    opt.wait_for_parameters();
    EXPECT_EQ(opt.parameter_gathers_in_flight(), 0);
    for (const OwnedShard& shard : opt.shards()) {
      for (int64_t i = shard.begin; i < shard.end; ++i) ASSERT_EQ(values[i], shard.master[i - shard.begin]);
    }
    for (const FlatRange& r : others) {
      for (int64_t i = r.begin; i < r.end; ++i) ASSERT_NE(values[i], 0.5f) << i;
    }
    EXPECT_GT(opt.parameter_gather_wait_s(), 0.0);
  });
}

}  // namespace
}  // namespace loom::parallel
