// train.rampup_batch_size and train.samples (train/batch_schedule.h) against step-by-step
// transcriptions of Megatron-LM's RampupBatchsizeNumMicroBatchesCalculator.update and
// update_train_iters, in exact integers: the global batch of every step start, the steps a
// sample budget takes, the samples after any number of steps and the ramp-up's length, over
// ramps whose stages are shorter than a batch, uneven, or long; and ramps of 10^12 samples,
// which the stage-at-a-time walk answers at once.
#include "loom/train/batch_schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace loom::train {
namespace {

config::TrainConfig ramp(int global, int64_t start, int64_t increment, int64_t samples, int64_t train_samples = 0) {
  config::TrainConfig t;
  t.global_batch = global;
  t.rampup_batch_size = {start, increment, samples};
  t.samples = train_samples;
  t.steps = train_samples > 0 ? 0 : 100;
  return t;
}

// Megatron's update(consumed): the start batch plus one increment per (ramp-up samples / n)
// consumed while consumed <= ramp-up samples, the global batch after.
int64_t megatron_batch(const config::TrainConfig& t, int64_t consumed) {
  const config::BatchRampup& r = t.rampup_batch_size;
  if (!r.on() || consumed > r.samples) return t.global_batch;
  const int64_t n = (t.global_batch - r.start) / r.increment;
  return r.start + static_cast<int64_t>(static_cast<__int128>(consumed) * n / r.samples) * r.increment;
}

// Megatron's update_train_iters: steps while consumed <= ramp-up samples and <= train samples,
// then whole global batches of the rest.
int64_t megatron_steps(const config::TrainConfig& t) {
  if (!t.rampup_batch_size.on()) return t.samples / t.global_batch;
  int64_t steps = 0, consumed = 0;
  while (consumed <= t.rampup_batch_size.samples && consumed <= t.samples) {
    consumed += megatron_batch(t, consumed);
    ++steps;
  }
  if (t.samples > consumed) steps += (t.samples - consumed) / t.global_batch;
  return steps;
}

std::vector<config::TrainConfig> ramps() {
  return {
      ramp(8, 4, 2, 8),          // stages of 4 samples: each one step
      ramp(64, 16, 16, 1000),    // stages of 333.3 samples
      ramp(64, 16, 16, 30),      // stages shorter than a batch: steps skip stages
      ramp(1536, 32, 32, 9000),  // GPT-3's start and increment, 47 stages
      ramp(12, 2, 5, 7),         // 2 stages of 3.5 samples
      ramp(9, 2, 1, 9),          // 7 stages of 9/7 samples (floating point lands short at 9)
      ramp(100, 1, 99, 1),       // one stage, one sample
  };
}

TEST(BatchSchedule, EveryStepStartTrainsOnMegatronsBatch) {
  for (const config::TrainConfig& t : ramps()) {
    SCOPED_TRACE(testing::Message() << "ramp [" << t.rampup_batch_size.start << ", " << t.rampup_batch_size.increment
                                    << ", " << t.rampup_batch_size.samples << "] to " << t.global_batch);
    for (int64_t consumed = 0; consumed <= 3 * t.rampup_batch_size.samples + 50; ++consumed) {
      ASSERT_EQ(global_batch_at(t, consumed), megatron_batch(t, consumed)) << "after " << consumed << " samples";
    }
    EXPECT_EQ(global_batch_at(t, 0), t.rampup_batch_size.start);
    EXPECT_EQ(global_batch_at(t, t.rampup_batch_size.samples), t.global_batch);  // exact, at the ramp-up's end
  }
  config::TrainConfig constant;
  constant.global_batch = 24;
  EXPECT_EQ(global_batch_at(constant, 0), 24);
  EXPECT_EQ(global_batch_at(constant, 1000), 24);
}

TEST(BatchSchedule, SamplesAfterStepsAndRampupStepsFollowTheSteps) {
  for (const config::TrainConfig& t : ramps()) {
    SCOPED_TRACE(testing::Message() << "ramp over " << t.rampup_batch_size.samples << " samples to " << t.global_batch);
    int64_t consumed = 0, below_global = 0;
    for (int64_t step = 0; step < 400; ++step) {
      ASSERT_EQ(samples_after_steps(t, step), consumed) << "after " << step << " steps";
      const int64_t batch = megatron_batch(t, consumed);
      if (batch < t.global_batch) ++below_global;
      consumed += batch;
    }
    EXPECT_EQ(rampup_steps(t), below_global);
  }
  config::TrainConfig constant;
  constant.global_batch = 24;
  EXPECT_EQ(samples_after_steps(constant, 7), 168);
  EXPECT_EQ(rampup_steps(constant), 0);
}

TEST(BatchSchedule, ARunOfSamplesTakesMegatronsSteps) {
  for (config::TrainConfig t : ramps()) {
    for (int64_t samples = 1; samples <= 4 * t.rampup_batch_size.samples + 3 * t.global_batch; ++samples) {
      t.samples = samples;
      t.steps = 0;
      ASSERT_EQ(training_steps(t), megatron_steps(t))
          << samples << " samples, ramp over " << t.rampup_batch_size.samples << " to " << t.global_batch;
    }
  }
  config::TrainConfig t;
  t.global_batch = 32;
  t.steps = 0;
  t.samples = 1000;
  EXPECT_EQ(training_steps(t), 31);  // a partial last batch is dropped
  t.samples = 0;
  t.steps = 17;
  EXPECT_EQ(training_steps(t), 17);
}

TEST(BatchSchedule, ATrillionSampleRampIsWalkedAStageAtATime) {
  // 47 stages of about 2 x 10^10 samples; a step-by-step walk would take about 1.3 x 10^9 steps.
  const config::TrainConfig t = ramp(1536, 32, 32, 1'000'000'000'000, 3'000'000'000'000);
  const int64_t ramp_steps = rampup_steps(t);
  const int64_t ramp_end = samples_after_steps(t, ramp_steps);
  EXPECT_LT(samples_after_steps(t, ramp_steps - 1), t.rampup_batch_size.samples);
  EXPECT_GE(ramp_end, t.rampup_batch_size.samples);
  EXPECT_EQ(global_batch_at(t, samples_after_steps(t, ramp_steps - 1)), 1536 - 32);
  EXPECT_EQ(global_batch_at(t, ramp_end), 1536);
  // Steps after the ramp-up take whole global batches; the run's last step ends within a batch
  // of train.samples.
  const int64_t steps = training_steps(t);
  EXPECT_EQ(samples_after_steps(t, ramp_steps + 10), ramp_end + 10 * 1536);
  const int64_t end = samples_after_steps(t, steps);
  EXPECT_LE(end, t.samples);
  EXPECT_GT(end + 1536, t.samples);
  // The stages' shares: the steps of stage k cover about samples / 47 samples at 32 (k + 1).
  double expected_steps = 0.0;
  for (int k = 0; k < 47; ++k) expected_steps += 1e12 / 47.0 / (32.0 * (k + 1));
  EXPECT_NEAR(static_cast<double>(ramp_steps), expected_steps, 47.0);
}

TEST(BatchSchedule, StepsGroupByTheirBatchInOrder) {
  for (config::TrainConfig t : ramps()) {
    for (const int64_t samples : {int64_t{0}, 3 * t.rampup_batch_size.samples + 5 * t.global_batch}) {
      t.samples = samples;
      t.steps = samples > 0 ? 0 : 37;
      std::vector<BatchSteps> expected;
      int64_t consumed = 0;
      for (int64_t step = 0; step < training_steps(t); ++step) {
        const int64_t batch = megatron_batch(t, consumed);
        if (expected.empty() || expected.back().batch != batch) expected.push_back({batch, 0});
        ++expected.back().steps;
        consumed += batch;
      }
      const std::vector<BatchSteps> groups = steps_by_batch(t);
      ASSERT_EQ(groups.size(), expected.size()) << "ramp over " << t.rampup_batch_size.samples;
      for (size_t i = 0; i < groups.size(); ++i) {
        EXPECT_EQ(groups[i].batch, expected[i].batch) << "group " << i;
        EXPECT_EQ(groups[i].steps, expected[i].steps) << "group " << i;
      }
    }
  }
  config::TrainConfig constant;
  constant.steps = 12;
  ASSERT_EQ(steps_by_batch(constant).size(), 1u);
  EXPECT_EQ(steps_by_batch(constant)[0].steps, 12);
  EXPECT_EQ(steps_by_batch(constant)[0].batch, constant.global_batch);
}

TEST(BatchSchedule, DescribesTheRampAndTheRunsLength) {
  const config::TrainConfig t = ramp(8, 4, 2, 8, 40);
  EXPECT_EQ(describe_batches(t), "batch: ramps up from 4 to 8 sequences by 2 over the first 8 samples (steps 1-2), "
                                 "then 8\n");
  EXPECT_EQ(run_length_key(t), "train.samples = 40 (5 steps)");  // 4 + 6 + 3 x 8 = 34; 40 - 34 < 8
  config::TrainConfig constant;
  EXPECT_EQ(describe_batches(constant), "");
  EXPECT_EQ(run_length_key(constant), "train.steps = 100");
}

}  // namespace
}  // namespace loom::train
