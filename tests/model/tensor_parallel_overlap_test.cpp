// Tensor parallelism's communication overlapped with compute (parallel.overlap_tp_comm): a
// column-parallel layer's backward waits for the sum of its input gradient only after its wgrad
// GEMM ran, and under sequence parallelism for the gather of its input only after its dgrad GEMM
// ran; each is waited for where it starts without the overlap. Either way the same bits, for the
// layer and for a whole model. Ranks are threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../gradient_check.h"
#include "loom/comm/launch.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/transformer.h"
#include "linear_pair.h"
#include "small_configs.h"
#include "support/observed_comm.h"
#include "support/thread_ranks.h"

namespace loom::model {
namespace {

using loom::testing::threads;

bool all_finite(const float* x, int64_t n) {
  return std::all_of(x, x + n, [](float v) { return std::isfinite(v); });
}

// What one rank's column-parallel backward left, and what it had computed at each wait.
struct ColumnRun {
  std::vector<std::string> waits;  // "kind" + " after dgrad" / " after wgrad" where those had run
  std::vector<float> d_x, weight_grad, bias_grad;
};

// tp 2: one backward of a column-parallel layer (12 rows of 6 into 2 x 4 features) whose weight
// gradient and dgrad scratch hold NaN until its GEMMs write them.
std::vector<ColumnRun> column_backward(bool sp, bool overlap) {
  const int ranks = 2;
  const int64_t rows = 12, in = 6, out = 8, part = out / ranks;
  const auto x = loom::testing::random_vector(rows * in, 1), d_y = loom::testing::random_vector(rows * out, 2);
  std::vector<ColumnRun> runs(ranks);
  comm::launch(threads(ranks), [&](comm::Communicator& world) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    ColumnRun& run = runs[static_cast<size_t>(world.rank())];
    ParameterStore store;
    ParallelScratch scratch;
    int weight = -1;
    loom::testing::ObservedCommunicator observed(world, [&](const std::string& kind) {
      const bool dgrad = all_finite(scratch.d_full.data(), rows * in);
      const bool wgrad = all_finite(store.grad(weight), part * in);
      run.waits.push_back(kind + (dgrad ? " after dgrad" : "") + (wgrad ? " after wgrad" : ""));
    });
    TensorParallel tp(&observed, sp, overlap);
    const int64_t start = world.rank() * part, local = tp.local_rows(rows);
    const auto ids = model::testing::add_sharded_linear_pair(store, tp, in, out, start, part, 0.5f);
    weight = ids.A;
    ColumnParallelLinear column(store, tp, ids.A, ids.a, in, part);
    store.zero_grads();  // the weight gradient stale: its wgrad writes it whole
    std::fill(store.grad(ids.A), store.grad(ids.A) + part * in, nan);
    float* d_full = sized(scratch.d_full, rows * in);
    std::fill(d_full, d_full + rows * in, nan);
    std::vector<float> d_y_local(rows * part);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(d_y.begin() + r * out + start, part, d_y_local.begin() + r * part);
    run.d_x.assign(static_cast<size_t>(local * in), 0.0f);
    column.backward(run.d_x.data(), d_y_local.data(), x.data() + tp.first_local_row(rows) * in, rows, scratch);
    run.weight_grad.assign(store.grad(ids.A), store.grad(ids.A) + part * in);
    run.bias_grad.assign(store.grad(ids.a), store.grad(ids.a) + part);
  });
  return runs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TensorParallelOverlap, ColumnBackwardWaitsForItsCollectivesAfterTheGemmsBesideThem) {
  const std::map<std::pair<bool, bool>, std::vector<std::string>> expected = {
      // {sequence parallel, overlap}: every rank's waits in order.
      {{false, true}, {"all_reduce after dgrad after wgrad"}},
      {{false, false}, {"all_reduce after dgrad"}},
      {{true, true}, {"all_gather after dgrad", "reduce_scatter after dgrad after wgrad"}},
      {{true, false}, {"all_gather", "reduce_scatter after dgrad"}},
  };
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    const std::vector<ColumnRun> overlapped = column_backward(sp, true), waited = column_backward(sp, false);
    for (size_t r = 0; r < overlapped.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(overlapped[r].waits, expected.at({sp, true}));
      EXPECT_EQ(waited[r].waits, expected.at({sp, false}));
      EXPECT_TRUE(all_finite(overlapped[r].d_x.data(), static_cast<int64_t>(overlapped[r].d_x.size())));
      EXPECT_TRUE(same_bits(overlapped[r].d_x, waited[r].d_x));
      EXPECT_TRUE(same_bits(overlapped[r].weight_grad, waited[r].weight_grad));
      EXPECT_TRUE(same_bits(overlapped[r].bias_grad, waited[r].bias_grad));
    }
  }
}

// Two micro-batches of a whole model at tp 2 under `recipe`: every rank's loss and gradients with
// the overlap bit for bit those without it.
std::vector<std::vector<float>> model_gradients(const config::ModelConfig& c, Recipe recipe, bool sp, bool overlap) {
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 13 + 1) % c.vocab_size);
  }
  std::vector<std::vector<float>> grads(2);
  comm::launch(threads(2), [&](comm::Communicator& world) {
    Transformer model(c, TensorParallel(&world, sp, overlap), PrecisionPolicy{.recipe = recipe});
    model.initialize(11);
    model.params().zero_grads();
    double loss = model.forward_backward(inputs.data(), targets.data(), batch, seq, 0.05f);
    loss += model.forward_backward(inputs.data(), targets.data(), batch, seq, 0.05f);
    std::vector<float>& mine = grads[static_cast<size_t>(world.rank())];
    mine.push_back(static_cast<float>(loss));
    for (const Parameter& p : model.params().list()) {
      const float* g = model.params().grad(model.params().find(p.name));
      mine.insert(mine.end(), g, g + p.numel);
    }
  });
  return grads;
}

TEST(TensorParallelOverlap, AModelTrainsBitForBitAsWithoutIt) {
  config::ModelConfig c = model::testing::small_gpt2();
  c.heads = 2;  // split over the two ranks
  for (const Recipe recipe : {Recipe::Fp32, Recipe::Bf16, Recipe::Fp8Current})
    for (const bool sp : {false, true}) {
      SCOPED_TRACE(recipe_name(recipe) + (sp ? ", sequence parallel" : ", tensor parallel"));
      const auto overlapped = model_gradients(c, recipe, sp, true), waited = model_gradients(c, recipe, sp, false);
      for (size_t r = 0; r < overlapped.size(); ++r) {
        EXPECT_GT(overlapped[r].size(), 1u);
        EXPECT_TRUE(all_finite(overlapped[r].data(), static_cast<int64_t>(overlapped[r].size())));
        EXPECT_TRUE(same_bits(overlapped[r], waited[r])) << "rank " << r;
      }
    }
}

}  // namespace
}  // namespace loom::model
