// ZeRO-3 against one rank: a small chain model with the transformer's unit structure (unit 0
// and the head share a tied matrix, blocks in between) trains for a few steps with gradient
// accumulation on dp 1, 2 and 4 ranks (threads backend) and must give the parameters, norms and
// moments of plain AdamW on the full gradient. While it runs, the resident parameters stay at
// the shard plus the units in flight, released pages really leave memory (mincore), and the
// full buffers read as zeros between micro-batches.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "loom/core/error.h"
#include "loom/parallel/data/zero3.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

using testing::random_values;
using testing::threads;

// Units: 0 = h0 = tanh(W0 x + b0); 1..L = h = tanh(W h + b); L + 1 = out = W0 (g * h), the
// head reading the tied W0 as the transformer's head reads the embedding. Loss 0.5 |out - y|^2.
struct Chain {
  int d = 79, layers = 12;  // 79: sections are not multiples of 2 or 4, nor of a page
  std::vector<ParamRange> params;
  std::vector<std::vector<int>> unit_params;
  std::vector<optim::Segment> segments;

  Chain() {
    int64_t offset = 0;
    auto add = [&](int64_t n, bool decay) {
      params.push_back({offset, n});
      segments.push_back({offset, n, decay});
      offset += n;
      return static_cast<int>(params.size()) - 1;
    };
    unit_params.resize(layers + 2);
    for (int u = 0; u <= layers; ++u) {
      unit_params[u].push_back(add(static_cast<int64_t>(d) * d, true));
      unit_params[u].push_back(add(d, false));
    }
    unit_params[layers + 1] = {add(d, false), 0};
  }
  int64_t total() const { return params.back().offset + params.back().numel; }

  // Adds this batch's gradient (scaled by `scale`) into grads; returns the loss sum.
  double forward_backward(const float* values, float* grads, const float* x, const float* y, int rows, float scale,
                          model::ParameterHooks* hooks) const {
    const int L = layers;
    auto W = [&](int u) { return params[unit_params[u][0]].offset; };
    auto B = [&](int u) { return params[unit_params[u][1]].offset; };
    const int64_t g_at = params[unit_params[L + 1][0]].offset;
    double loss = 0.0;
    std::vector<std::vector<float>> h(L + 1, std::vector<float>(static_cast<size_t>(rows) * d));
    std::vector<float> z(static_cast<size_t>(rows) * d), out(z.size()), dh(z.size()), next(z.size());
    auto layer = [&](int u, const float* in, float* o) {
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < d; ++i) {
          float a = values[B(u) + i];
          for (int j = 0; j < d; ++j) a += values[W(u) + i * d + j] * in[r * d + j];
          o[r * d + i] = std::tanh(a);
        }
      }
    };
    auto layer_back = [&](int u, const float* in, const float* o, const float* d_o, float* d_in) {
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < d; ++i) {
          const float da = d_o[r * d + i] * (1.0f - o[r * d + i] * o[r * d + i]);
          grads[B(u) + i] += da;
          for (int j = 0; j < d; ++j) grads[W(u) + i * d + j] += da * in[r * d + j];
        }
      }
      if (d_in == nullptr) return;
      std::fill(d_in, d_in + static_cast<size_t>(rows) * d, 0.0f);
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < d; ++i) {
          const float da = d_o[r * d + i] * (1.0f - o[r * d + i] * o[r * d + i]);
          for (int j = 0; j < d; ++j) d_in[r * d + j] += values[W(u) + i * d + j] * da;
        }
      }
    };
    if (hooks) hooks->before_forward(0);
    layer(0, x, h[0].data());
    if (hooks) hooks->after_forward(0);
    for (int l = 1; l <= L; ++l) {
      if (hooks) hooks->before_forward(l);
      layer(l, h[l - 1].data(), h[l].data());
      if (hooks) hooks->after_forward(l);
    }
    if (hooks) hooks->before_forward(L + 1);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < d; ++j) z[r * d + j] = values[g_at + j] * h[L][r * d + j];
      for (int i = 0; i < d; ++i) {
        float a = 0.0f;
        for (int j = 0; j < d; ++j) a += values[W(0) + i * d + j] * z[r * d + j];
        out[r * d + i] = a - y[r * d + i];
        loss += 0.5 * static_cast<double>(out[r * d + i]) * out[r * d + i];
      }
    }
    if (hooks) hooks->after_forward(L + 1);

    if (hooks) hooks->before_backward(L + 1);
    std::fill(dh.begin(), dh.end(), 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < d; ++i) {
        const float dout = scale * out[r * d + i];
        for (int j = 0; j < d; ++j) {
          grads[W(0) + i * d + j] += dout * z[r * d + j];
          dh[r * d + j] += values[W(0) + i * d + j] * dout;  // dz for now
        }
      }
      for (int j = 0; j < d; ++j) {
        grads[g_at + j] += dh[r * d + j] * h[L][r * d + j];
        dh[r * d + j] *= values[g_at + j];
      }
    }
    if (hooks) hooks->after_backward(L + 1);
    for (int l = L; l >= 1; --l) {
      if (hooks) hooks->before_backward(l);
      layer_back(l, h[l - 1].data(), h[l].data(), dh.data(), next.data());
      std::swap(dh, next);
      if (hooks) hooks->after_backward(l);
    }
    if (hooks) hooks->before_backward(0);
    layer_back(0, x, h[0].data(), dh.data(), nullptr);
    if (hooks) hooks->after_backward(0);
    return loss;
  }
};

config::OptimConfig config() {
  config::OptimConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.clip_grad = 0.5;  // active for these gradients: the norm spans every shard
  return c;
}

constexpr int kRows = 8, kMicro = 2, kSteps = 3;

std::vector<float> batch(uint64_t seed, const Chain& chain) { return random_values(seed, int64_t{kRows} * chain.d); }

// Page-aligned storage, so mincore can inspect exactly the buffer's pages.
struct PageBuffer {
  explicit PageBuffer(int64_t n) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    bytes = (static_cast<size_t>(n) * sizeof(float) + page - 1) / page * page;
    data.reset(static_cast<float*>(std::aligned_alloc(page, bytes)));
    std::fill(data.get(), data.get() + n, 0.0f);
  }
  // Pages of the buffer resident in memory now.
  int64_t resident_pages() const {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec(bytes / page);
    if (::mincore(data.get(), bytes, vec.data()) != 0) return -1;
    return std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return (c & 1) != 0; });
  }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data;
  size_t bytes = 0;
};

struct Reference {
  std::vector<float> params;  // after the last step
  std::vector<double> norms;
  std::vector<float> exp_avg, exp_avg_sq;
};

Reference reference(const Chain& chain, const std::vector<float>& initial, int ranks) {
  Reference ref;
  std::vector<float> values = initial, grads(values.size());
  optim::AdamW adamw(config(), chain.total(), chain.segments);
  for (int step = 1; step <= kSteps; ++step) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    // The same global batch the ranks split: rank r, micro-batch m.
    for (int r = 0; r < ranks; ++r) {
      for (int m = 0; m < kMicro; ++m) {
        const uint64_t seed = 100 * static_cast<uint64_t>(step) + 10 * r + m;
        std::vector<float> x = batch(seed, chain), y = batch(seed + 5000, chain);
        chain.forward_backward(values.data(), grads.data(), x.data(), y.data(), kRows, 0.05f, nullptr);
      }
    }
    ref.norms.push_back(adamw.step(values.data(), grads.data(), 1e-2, step));
  }
  ref.params = values;
  ref.exp_avg.assign(adamw.exp_avg(), adamw.exp_avg() + chain.total());
  ref.exp_avg_sq.assign(adamw.exp_avg_sq(), adamw.exp_avg_sq() + chain.total());
  return ref;
}

double relative_difference(const std::vector<float>& a, const float* b) {
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
  }
  return diff / scale;
}

struct Observed {
  double worst_param = 0.0, worst_norm = 0.0, worst_moment = 0.0;
  int64_t peak_parameters = 0, peak_gradients = 0, shard = 0, full = 0, largest_section = 0;
  bool released_reads_zero = true;
  int64_t resident_value_pages_between = 0, resident_grad_pages_between = 0, value_pages = 0, sections = 0;
};

void run_ranks(int ranks, bool prefetch, std::vector<Observed>& seen) {
  Chain chain;
  const std::vector<float> initial = random_values(7, chain.total(), 0.2f);
  const Reference ref = reference(chain, initial, ranks);
  seen.assign(ranks, {});
  comm::launch(threads(ranks), [&](comm::Communicator& dp) {
    Observed& o = seen[dp.rank()];
    PageBuffer values(chain.total()), grads(chain.total());
    std::copy(initial.begin(), initial.end(), values.data.get());
    Zero3Options options;
    options.prefetch = prefetch;
    Zero3 zero3(dp, values.data.get(), grads.data.get(), chain.params, chain.unit_params, chain.segments, config(),
                options);
    for (int step = 1; step <= kSteps; ++step) {
      for (int m = 0; m < kMicro; ++m) {
        const uint64_t seed = 100 * static_cast<uint64_t>(step) + 10 * dp.rank() + m;
        std::vector<float> x = batch(seed, chain), y = batch(seed + 5000, chain);
        zero3.begin_micro_batch();
        chain.forward_backward(values.data.get(), grads.data.get(), x.data(), y.data(), kRows, 0.05f, &zero3);
        zero3.end_micro_batch();
        // Between micro-batches nothing is gathered: both full buffers hold at most the pages
        // shared by two sections, and read as zeros (counted before reading: a read maps the
        // kernel's shared zero page, which mincore reports as resident).
        o.resident_value_pages_between = std::max(o.resident_value_pages_between, values.resident_pages());
        o.resident_grad_pages_between = std::max(o.resident_grad_pages_between, grads.resident_pages());
        for (int64_t i = 0; i < chain.total(); ++i) {
          if (values.data.get()[i] != 0.0f || grads.data.get()[i] != 0.0f) o.released_reads_zero = false;
        }
      }
      o.worst_norm = std::max(o.worst_norm, std::fabs(zero3.step(1e-2, step) - ref.norms[step - 1]) / ref.norms[step - 1]);
    }
    // Read before the full gather below, which holds the whole model by design.
    const Zero3Memory mem = zero3.memory();
    zero3.gather_full_parameters();
    o.worst_param = relative_difference(ref.params, values.data.get());
    zero3.release_full_parameters();
    std::vector<float> m(chain.total()), v(chain.total());
    zero3.gather_moments(m.data(), v.data());
    o.worst_moment = std::max(relative_difference(ref.exp_avg, m.data()), relative_difference(ref.exp_avg_sq, v.data()));
    o.peak_parameters = mem.peak_parameters / 4;
    o.peak_gradients = mem.peak_gradients / 4;
    o.shard = mem.parameter_shard / 4;
    o.full = mem.full_parameters / 4;
    o.value_pages = static_cast<int64_t>(values.bytes / static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
    o.sections = zero3.sections();
    for (int s = 0; s < zero3.sections(); ++s) o.largest_section = std::max(o.largest_section, zero3.section_range(s).size());
  });
}

class Zero3Ranks : public ::testing::TestWithParam<int> {};

TEST_P(Zero3Ranks, TrainsLikeOneRankWithOnlyTheUnitsInFlightResident) {
  const int ranks = GetParam();
  std::vector<Observed> seen;
  run_ranks(ranks, true, seen);
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Observed& o = seen[r];
    EXPECT_LE(o.worst_param, 1e-5);
    EXPECT_LE(o.worst_norm, 1e-5);
    EXPECT_LE(o.worst_moment, 1e-5);
    EXPECT_TRUE(o.released_reads_zero);
    // Released pages left memory: only pages shared by two sections may remain.
    EXPECT_LE(o.resident_value_pages_between, o.sections + 1);
    EXPECT_LE(o.resident_grad_pages_between, o.sections + 1);
    EXPECT_GT(o.value_pages, 2 * (o.sections + 1));  // so that the check above means something
    // The shard plus at most three sections in flight: the unit computing, the one prefetched,
    // and the tied section the head reads.
    EXPECT_LE(o.shard, o.full / ranks + o.sections);
    EXPECT_LE(o.peak_parameters, o.shard + 3 * o.largest_section);
    EXPECT_LE(o.peak_gradients, (o.full + ranks * o.sections) / ranks + 2 * o.largest_section);
    if (ranks > 1) {
      EXPECT_LT(o.peak_parameters, o.full * 3 / 4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dp, Zero3Ranks, ::testing::Values(1, 2, 4));

TEST(Zero3, WithoutPrefetchComputesTheSameAndHoldsLess) {
  std::vector<Observed> seen;
  run_ranks(2, false, seen);
  for (const Observed& o : seen) {
    EXPECT_LE(o.worst_param, 1e-5);
    EXPECT_LE(o.peak_parameters, o.shard + 2 * o.largest_section);  // the head and the tied section
  }
}

TEST(Zero3, MisuseIsAnError) {
  Chain chain;
  comm::launch(threads(1), [&](comm::Communicator& dp) {
    std::vector<float> values = random_values(3, chain.total()), grads(values.size());
    Zero3 zero3(dp, values.data(), grads.data(), chain.params, chain.unit_params, chain.segments, config());
    EXPECT_THROW(zero3.step(1e-2, 1), Error);         // no gradients yet
    EXPECT_THROW(zero3.before_forward(0), Error);     // outside a micro-batch, parameters sharded
    zero3.gather_full_parameters();
    EXPECT_NO_THROW(zero3.before_forward(0));         // evaluation over the full parameters
    EXPECT_NO_THROW(zero3.after_forward(0));
    EXPECT_THROW(zero3.before_backward(0), Error);    // gradients are reduced within micro-batches
    zero3.release_full_parameters();
    std::vector<std::vector<int>> unread = chain.unit_params;
    unread[1].pop_back();       // a parameter no unit reads
    EXPECT_THROW(Zero3(dp, values.data(), grads.data(), chain.params, unread, chain.segments, config()), Error);
  });
}

}  // namespace
}  // namespace loom::parallel
