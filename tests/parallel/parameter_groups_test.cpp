// Parameter groups reduced over their own communicators: on 4 ranks the dense group is summed
// over all of them and the last block's parameters over pairs of ranks only (as expert
// parameters would be over an expert-data-parallel group). Each group's reduced gradient must
// be the serial sum of the local gradients over its own communicator, and the step must give
// what one AdamW step on those sums gives, at ZeRO 0, 1 and 2.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "loom/comm/launch.h"
#include "loom/optim/adamw.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

constexpr int kRanks = 4, kBatch = 2, kSeq = 8;
constexpr float kScale = 1.0f / (kRanks * kBatch * kSeq);

config::RunConfig run_config(int zero) {
  config::RunConfig c;
  c.model.vocab_size = 37;
  c.model.d_model = 16;
  c.model.layers = 2;
  c.model.heads = 2;
  c.model.kv_heads = 2;
  c.model.ffn_size = 24;
  c.model.max_seq_len = kSeq;
  c.parallel.zero = zero;
  c.parallel.bucket_mb = 0.002;  // several buckets per group
  c.optim.clip_grad = 0.5;
  return c;
}

// Rank r's micro-batch.
std::vector<int32_t> tokens(int r, int salt) {
  std::vector<int32_t> out;
  for (int i = 0; i < kBatch * kSeq; ++i) out.push_back((i * 7 + r * 13 + salt) % 37);
  return out;
}

// The local gradient of every rank's micro-batch, computed serially on one model.
std::vector<std::vector<float>> local_gradients(const config::RunConfig& c) {
  model::Transformer model(c.model);
  model.initialize(5);
  std::vector<std::vector<float>> out;
  for (int r = 0; r < kRanks; ++r) {
    model.params().zero_grads();
    const std::vector<int32_t> in = tokens(r, 1), target = tokens(r, 2);
    model.forward_backward(in.data(), target.data(), kBatch, kSeq, kScale);
    out.emplace_back(model.params().grads(), model.params().grads() + model.params().total());
  }
  return out;
}

TEST(ParameterGroups, EachGroupIsSummedOverItsOwnCommunicator) {
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const config::RunConfig c = run_config(zero);
    const std::vector<std::vector<float>> local = local_gradients(c);
    std::mutex mutex;
    comm::launch(testing::threads(kRanks), [&](comm::Communicator& world) {
      const int r = world.rank(), pair = r / 2;
      std::unique_ptr<comm::Communicator> pairs = world.split(pair, r % 2, "pair-" + std::to_string(pair));
      model::Transformer model(c.model);
      model.initialize(5);
      const std::vector<int> last_block = model.unit_parameters(c.model.layers);
      GradientSyncOptions options;
      options.groups.push_back({"dense", {}, &world});
      options.groups.push_back({"pairs", last_block, pairs.get()});
      for (int id = 0; id < static_cast<int>(model.params().list().size()); ++id) {
        if (std::find(last_block.begin(), last_block.end(), id) == last_block.end()) options.groups[0].params.push_back(id);
      }
      DataParallelStep step(world, model, c, options);

      // The serial reference: each group's sum over its own communicator, then one AdamW step.
      const int64_t n = model.params().total();
      std::vector<float> expected(static_cast<size_t>(n), 0.0f);
      std::vector<char> in_pairs(static_cast<size_t>(n), 0);
      for (int id : last_block) {
        const model::Parameter& p = model.params().list()[id];
        std::fill(in_pairs.begin() + p.offset, in_pairs.begin() + p.offset + p.numel, 1);
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int q = 0; q < kRanks; ++q) {
          if (!in_pairs[i] || q / 2 == pair) expected[i] += local[q][i];
        }
      }
      std::vector<float> values(model.params().values(), model.params().values() + n);
      optim::AdamW reference(c.optim, n, optimizer_segments(model.params()));
      const double reference_norm = reference.step(values.data(), expected.data(), 1e-2, 1);

      const std::vector<int32_t> in = tokens(r, 1), target = tokens(r, 2);
      step.begin_micro_batch(true);
      model.forward_backward(in.data(), target.data(), kBatch, kSeq, kScale);
      step.end_micro_batch(true);
      if (zero == 0) {
        const std::vector<std::span<float>> reduced = step.reduced_gradients();
        std::lock_guard<std::mutex> lock(mutex);
        ASSERT_EQ(reduced.size(), 1u);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_FLOAT_EQ(reduced[0][i], expected[i]) << "rank " << r << " element " << i << (in_pairs[i] ? " (pairs)" : " (dense)");
        }
      }
      const double norm = step.step(1e-2, 1);
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_NEAR(norm, reference_norm, 1e-5 * reference_norm) << "rank " << r;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(model.params().values()[i], values[i], 1e-6) << "rank " << r << " element " << i;
      }
    });
  }
}

}  // namespace
}  // namespace loom::parallel
