// precision.grad_reduce=bf16: GradReducer rounds each bucket to bf16, all-reduces it in bf16
// (f32 accumulation in rank order, one rounding) and widens the result back into the fp32
// gradients; every rank gets bitwise that value.
#include <gtest/gtest.h>

#include <mutex>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"
#include "loom/parallel/grad_buckets.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

using testing::random_values;
using testing::ranges;
using testing::threads;
using testing::total;

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
          sum += comm::bf16_to_f32(comm::f32_to_bf16(v));
          sum_f32 += v;
        }
        const float expected = comm::bf16_to_f32(comm::f32_to_bf16(sum));
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

}  // namespace
}  // namespace loom::parallel
