// A trainer step of several optimizer updates (Trainer::step with update batches, GRPO's
// minibatches) is those updates taken as steps of their own at the step's learning rate: with a
// constant schedule, steps of two updates over consecutive batches equal steps of one, the
// parameters and Adam moments bit for bit, at one rank and at dp 2 with ZeRO-1, and updates of
// different sizes too; AdamW's step number counts the updates across a resume; the objective sees
// the later updates' batches before the first update, under the step's starting parameters.
#include <gtest/gtest.h>

#include <mutex>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/kernels/types.h"
#include "loom/train/run_ranks.h"
#include "loom/train/trainer.h"
#include "training_runs.h"

namespace loom::train {
namespace {

// Random bytes, the same for a global sample index on every rank.
class RandomBytes : public BatchSource {
 public:
  void fill(int64_t first, TokenBatch& batch) const override {
    const size_t n = static_cast<size_t>(batch.batch) * static_cast<size_t>(batch.seq);
    batch.inputs.assign(n, 0);
    batch.targets.assign(n, 0);
    batch.loss_weights.assign(n, 1.0f);
    for (int r = 0; r < batch.batch; ++r) {
      for (int t = 0; t < batch.seq; ++t) {
        const size_t at = static_cast<size_t>(r) * static_cast<size_t>(batch.seq) + static_cast<size_t>(t);
        batch.inputs[at] = static_cast<int32_t>(philox4x32(5, static_cast<uint64_t>(first + r), t)[0] % 256);
        batch.targets[at] = static_cast<int32_t>(philox4x32(5, static_cast<uint64_t>(first + r), t + 1)[0] % 256);
      }
    }
  }
  std::string describe() const override { return "random bytes"; }
};

// Records what the trainer shows it: each before_updates call's update and first target, each
// prepare's update; cross-entropy's loss (the head's -logp) for the rows it is given.
class RecordingObjective : public StepObjective {
 public:
  struct Seen {
    std::string call;
    int update;
    int32_t first_target;
  };
  void before_updates(Trainer& trainer, const TokenBatch& batch, int update) override {
    seen.push_back({"before", update, batch.targets.front()});
    logprobs_before.push_back(trainer.target_logprobs(batch, nullptr));
  }
  void prepare(Trainer& /*trainer*/, const TokenBatch& batch, int update) override {
    seen.push_back({"prepare", update, batch.targets.front()});
  }
  double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) override {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      gradient[r] = targets[r] == kernels::kIgnoreIndex ? 0.0f : -1.0f;
      sum -= targets[r] == kernels::kIgnoreIndex ? 0.0 : logp[r];
    }
    return sum;
  }
  std::vector<Seen> seen;
  std::vector<std::vector<float>> logprobs_before;
};

class StepUpdatesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = testing::make_training_root("step-updates"); }

  static config::RunConfig config(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string yaml =
        "run: {dir: " + root_ + "/" + name + "}\n" +
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
        "data: {tokenizer: byte, seq_len: 16}\n"
        "optim: {lr: 1.0e-3, schedule: constant, warmup_steps: 0, clip_grad: 1.0, eps: 1.0e-6}\n"
        "train: {steps: 8, global_batch: 8, micro_batch: 2, threads: 1, seed: 1234}\n"
        "log: {progress: false}\n";
    return config::parse_config(yaml, name, overrides);
  }

  // Runs `steps` (each its updates' batch sizes) from the run's start or its checkpoint
  // (train.resume), then saves; rank 0's results.
  static std::vector<StepResult> run(const std::string& name, std::vector<std::string> overrides,
                                     const std::vector<std::vector<int64_t>>& steps) {
    const config::RunConfig c = config(name, overrides);
    const RandomBytes source;
    std::ostringstream out;
    std::vector<StepResult> results;
    std::mutex mutex;
    run_on_ranks(c, out, [&](comm::Communicator& world) {
      Trainer trainer(c, world, source, nullptr, out);
      trainer.restore();
      std::vector<StepResult> mine;
      for (const std::vector<int64_t>& updates : steps) mine.push_back(trainer.step(0, updates));
      trainer.save();
      trainer.finish();
      if (world.rank() == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        results = mine;
      }
      return TrainSummary{};
    });
    return results;
  }

  static std::string root_;
};
std::string StepUpdatesTest::root_;

TEST_F(StepUpdatesTest, UpdatesOfAStepAreStepsOfTheirOwn) {
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"runtime.ranks=2", "parallel.zero=1"}}) {
    const std::string tag = layout.empty() ? "one" : "dp2";
    SCOPED_TRACE(tag);
    const std::vector<StepResult> single = run("single-" + tag, layout, {{8}, {4}, {8}, {8}});
    const std::vector<StepResult> paired = run("paired-" + tag, layout, {{8, 4}, {8, 8}});
    ASSERT_EQ(single.size(), 4u);
    ASSERT_EQ(paired.size(), 2u);
    EXPECT_EQ(paired[1].step, 2);
    EXPECT_EQ(paired[0].global_batch, 12);
    for (size_t s = 0; s < 2; ++s) {
      ASSERT_EQ(paired[s].update_losses.size(), 2u);
      for (size_t u = 0; u < 2; ++u) {
        EXPECT_EQ(paired[s].update_losses[u], single[2 * s + u].loss) << "step " << s + 1 << " update " << u + 1;
        EXPECT_EQ(paired[s].update_grad_norms[u], single[2 * s + u].grad_norm);
      }
      const double tokens = static_cast<double>(single[2 * s].trained_tokens + single[2 * s + 1].trained_tokens);
      EXPECT_EQ(paired[s].trained_tokens, single[2 * s].trained_tokens + single[2 * s + 1].trained_tokens);
      EXPECT_NEAR(paired[s].loss,
                  (single[2 * s].loss * static_cast<double>(single[2 * s].trained_tokens) +
                   single[2 * s + 1].loss * static_cast<double>(single[2 * s + 1].trained_tokens)) / tokens,
                  1e-12);
      EXPECT_NEAR(paired[s].grad_norm, 0.5 * (single[2 * s].grad_norm + single[2 * s + 1].grad_norm), 1e-12);
    }
    EXPECT_EQ(testing::state_difference(root_, "single-" + tag, "paired-" + tag), 0.0);
  }
  // Resumed after the first step: AdamW's next update is its third (the checkpoint's update count).
  ASSERT_EQ(run("resumed", {}, {{8, 4}}).size(), 1u);
  const std::vector<StepResult> resumed = run("resumed", {"train.resume=true"}, {{8, 8}});
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].step, 2);
  EXPECT_EQ(testing::state_difference(root_, "paired-one", "resumed"), 0.0);
}

// The objective sees updates 1 and 2's batches (this rank's rows of them) before update 0's
// prepare, with the step's starting parameters: their log-probabilities then are the ones a
// forward-only pass gives before the step.
TEST_F(StepUpdatesTest, TheObjectiveSeesTheLaterUpdatesFirst) {
  const config::RunConfig c = config("objective", {});
  const RandomBytes source;
  std::ostringstream out;
  RecordingObjective objective;
  std::vector<TokenBatch> batches(3);
  std::vector<std::vector<float>> expected;
  StepResult result;
  run_on_ranks(c, out, [&](comm::Communicator& world) {
    Trainer trainer(c, world, source, nullptr, out);
    trainer.set_objective(&objective);
    // The batches' targets and their log-probabilities before any update.
    for (size_t u = 0; u < 3; ++u) {
      batches[u].resize(u == 1 ? 4 : 8, 16);
      source.fill(u == 0 ? 0 : u == 1 ? 8 : 12, batches[u]);
      batches[u].mask_and_count(source, 0);
      expected.push_back(trainer.target_logprobs(batches[u], nullptr));
    }
    const std::vector<int64_t> updates = {8, 4, 8};
    result = trainer.step(0, updates);
    trainer.set_objective(nullptr);
    trainer.finish();
    return TrainSummary{};
  });
  EXPECT_EQ(result.update_losses.size(), 3u);
  ASSERT_EQ(objective.seen.size(), 5u);
  const std::vector<std::pair<std::string, int>> order = {
      {"before", 1}, {"before", 2}, {"prepare", 0}, {"prepare", 1}, {"prepare", 2}};
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(objective.seen[i].call, order[i].first) << i;
    EXPECT_EQ(objective.seen[i].update, order[i].second) << i;
    EXPECT_EQ(objective.seen[i].first_target, batches[static_cast<size_t>(order[i].second)].targets.front()) << i;
  }
  ASSERT_EQ(objective.logprobs_before.size(), 2u);
  EXPECT_EQ(objective.logprobs_before[0], expected[1]);
  EXPECT_EQ(objective.logprobs_before[1], expected[2]);
}

TEST_F(StepUpdatesTest, RefusesUpdatesTheLayoutCannotTake) {
  const config::RunConfig c = config("refuse", {"runtime.ranks=2"});
  const RandomBytes source;
  std::ostringstream out;
  run_on_ranks(c, out, [&](comm::Communicator& world) {
    Trainer trainer(c, world, source, nullptr, out);
    try {
      const std::vector<int64_t> updates = {8, 2};
      trainer.step(0, updates);
      ADD_FAILURE() << "an update of 2 sequences at dp 2 x micro-batch 2 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a step of 2 sequences: valid are multiples of"), std::string::npos)
          << e.what();
    }
    trainer.finish();
    return TrainSummary{};
  });
}

}  // namespace
}  // namespace loom::train
