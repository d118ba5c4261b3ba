#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/kernels/ops.h"
#include "loom/optim/adamw.h"
#include "loom/optim/optimizer.h"
#include "loom/optim/schedule.h"

namespace loom::optim {
namespace {

TEST(Schedule, WarmupThenCosineToMinLr) {
  config::OptimConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10, 110), 1.0);
  EXPECT_NEAR(learning_rate(c, 60, 110), 0.55, 1e-12);  // halfway through the cosine
  EXPECT_NEAR(learning_rate(c, 110, 110), 0.1, 1e-12);
  c.schedule = config::LrSchedule::Constant;
  EXPECT_DOUBLE_EQ(learning_rate(c, 50, 110), 1.0);
}

// Megatron-Core's OptimizerParamScheduler.get_lr, transcribed from its published formulas (init_lr
// 0, num_steps = the optimizer step), as the reference for every schedule.
double megatron_lr(const std::string& style, const std::string& wsd_style, double max_lr, double min_lr, int warmup,
                   int decay_steps, int wsd_decay_steps, int num_steps) {
  if (warmup > 0 && num_steps <= warmup) return max_lr * num_steps / warmup;
  if (style == "constant") return max_lr;
  if (num_steps > decay_steps) return min_lr;
  if (style == "inverse-square-root") {
    return std::max(min_lr, max_lr * std::pow(std::max(warmup, 1), 0.5) / std::pow(std::max(num_steps, 1), 0.5));
  }
  const double decay_ratio = double(num_steps - warmup) / double(decay_steps - warmup);
  double coeff = 0;
  if (style == "linear") coeff = 1.0 - decay_ratio;
  if (style == "cosine") coeff = 0.5 * (std::cos(M_PI * decay_ratio) + 1.0);
  if (style == "WSD") {
    const int anneal_start = decay_steps - wsd_decay_steps;
    if (num_steps <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = double(num_steps - anneal_start) / wsd_decay_steps;
      if (wsd_style == "linear") coeff = 1.0 - r;
      if (wsd_style == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      if (wsd_style == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      if (wsd_style == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
    }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

TEST(Schedule, EveryScheduleIsMegatronsAtEveryStep) {
  struct Case {
    config::LrSchedule schedule;
    std::string megatron;
    config::WsdDecay wsd;
    std::string megatron_wsd;
  };
  using config::LrSchedule;
  using config::WsdDecay;
  const std::vector<Case> cases = {
      {LrSchedule::Cosine, "cosine", WsdDecay::Exponential, ""},
      {LrSchedule::Linear, "linear", WsdDecay::Exponential, ""},
      {LrSchedule::InverseSquareRoot, "inverse-square-root", WsdDecay::Exponential, ""},
      {LrSchedule::Constant, "constant", WsdDecay::Exponential, ""},
      {LrSchedule::Wsd, "WSD", WsdDecay::Exponential, "exponential"},
      {LrSchedule::Wsd, "WSD", WsdDecay::Linear, "linear"},
      {LrSchedule::Wsd, "WSD", WsdDecay::Cosine, "cosine"},
      {LrSchedule::Wsd, "WSD", WsdDecay::MinusSqrt, "minus_sqrt"},
  };
  const int total = 120;
  for (const Case& k : cases) {
    for (const int decay_steps : {0, 90}) {  // 0: the decay ends with the run; 90: 30 steps at min_lr after it
      config::OptimConfig c;
      c.lr = 3e-4;
      c.min_lr = 2e-5;
      c.warmup_steps = 7;
      c.schedule = k.schedule;
      c.decay_steps = decay_steps;
      c.wsd_decay_steps = k.schedule == LrSchedule::Wsd ? 25 : 0;
      c.wsd_decay_style = k.wsd;
      const int megatron_decay = decay_steps > 0 ? decay_steps : total;
      for (int step = 1; step <= total; ++step) {
        const double want = megatron_lr(k.megatron, k.megatron_wsd, c.lr, c.min_lr, c.warmup_steps, megatron_decay,
                                        c.wsd_decay_steps, step);
        ASSERT_NEAR(learning_rate(c, step, total), want, 1e-15)
            << k.megatron << " " << k.megatron_wsd << " decay_steps " << decay_steps << " step " << step;
      }
    }
  }
}

TEST(Schedule, WsdHoldsTheRateUntilItsAnnealingThenReachesMinLr) {
  config::OptimConfig c;
  c.lr = 1.0;
  c.min_lr = 0.0;
  c.warmup_steps = 10;
  c.schedule = config::LrSchedule::Wsd;
  c.wsd_decay_steps = 20;
  c.wsd_decay_style = config::WsdDecay::Linear;
  EXPECT_DOUBLE_EQ(learning_rate(c, 10, 100), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 80, 100), 1.0);   // the annealing starts after step 100 - 20
  EXPECT_DOUBLE_EQ(learning_rate(c, 90, 100), 0.5);   // halfway through it
  EXPECT_DOUBLE_EQ(learning_rate(c, 100, 100), 0.0);
  c.wsd_decay_style = config::WsdDecay::MinusSqrt;
  EXPECT_NEAR(learning_rate(c, 85, 100), 0.5, 1e-15);  // 1 - sqrt(1/4)
  c.decay_steps = 60;                                   // the decay ends early; min_lr after it
  EXPECT_DOUBLE_EQ(learning_rate(c, 40, 100), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 61, 100), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 100, 100), 0.0);
}

TEST(Schedule, InverseSquareRootFallsFromTheWarmupsEndAndStopsAtMinLr) {
  config::OptimConfig c;
  c.lr = 1.0;
  c.min_lr = 0.3;
  c.warmup_steps = 4;
  c.schedule = config::LrSchedule::InverseSquareRoot;
  EXPECT_DOUBLE_EQ(learning_rate(c, 4, 1000), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 16, 1000), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 64, 1000), 0.3);  // 0.25 < min_lr
}

// A run measured in samples (train.samples) counts the schedule in samples consumed: with
// global batches of 24 and every length a whole number of them, step k's rate is the one at
// 24 k samples, for every schedule and annealing shape.
TEST(Schedule, InSamplesOfWholeBatchesEveryStepHasTheRateOfItsStep) {
  const int64_t batch = 24, steps = 120;
  for (const config::LrSchedule schedule :
       {config::LrSchedule::Cosine, config::LrSchedule::Linear, config::LrSchedule::Wsd,
        config::LrSchedule::InverseSquareRoot, config::LrSchedule::Constant}) {
    for (const int decay_steps : {0, 90}) {
      config::OptimConfig by_steps;
      by_steps.lr = 1.0;
      by_steps.min_lr = 0.05;
      by_steps.schedule = schedule;
      by_steps.warmup_steps = 10;
      by_steps.decay_steps = decay_steps;
      by_steps.wsd_decay_steps = schedule == config::LrSchedule::Wsd ? 30 : 0;
      by_steps.wsd_decay_style = config::WsdDecay::Cosine;
      config::OptimConfig by_samples = by_steps;
      by_samples.warmup_steps = by_samples.decay_steps = by_samples.wsd_decay_steps = 0;
      by_samples.warmup_samples = by_steps.warmup_steps * batch;
      by_samples.decay_samples = by_steps.decay_steps * batch;
      by_samples.wsd_decay_samples = by_steps.wsd_decay_steps * batch;
      for (int64_t step = 1; step <= steps; ++step) {
        EXPECT_DOUBLE_EQ(learning_rate(by_samples, step * batch, steps * batch, ScheduleUnit::Samples),
                         learning_rate(by_steps, step, steps))
            << "schedule " << static_cast<int>(schedule) << ", decay_steps " << decay_steps << ", step " << step;
      }
    }
  }
  // Between whole batches the warm-up rises with each sample.
  config::OptimConfig c;
  c.lr = 1.0;
  c.warmup_samples = 1000;
  EXPECT_DOUBLE_EQ(learning_rate(c, 250, 10000, ScheduleUnit::Samples), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 251, 10000, ScheduleUnit::Samples), 0.251);
}

// The global norm of a layout adds the sums of squares of its pieces (kernels::sum_of_squares);
// each square exact in fp64 and summed there, the pieces' total equals the whole tensor's to fp64
// rounding wherever the cuts fall (fp32 partials over blocks that start at each cut were ~1e-7
// apart), and so does the fp32 clip factor taken from it.
TEST(AdamW, ClipFactorOfATensorsPiecesIsTheWholesBitForBit) {
  const int64_t n = 100003;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 0.02f;
  const double whole = kernels::sum_of_squares(Device::cpu(), x.data(), n);
  config::OptimConfig c;
  c.clip_grad = 1e-3;  // below the norm (~4.5): the factor is clip / norm
  for (int64_t cut : {1, 777, 4096, 50001, 99999}) {
    const double pieces = kernels::sum_of_squares(Device::cpu(), x.data(), cut) +
                          kernels::sum_of_squares(Device::cpu(), x.data() + cut, n - cut);
    EXPECT_NEAR(pieces, whole, 1e-13 * whole) << "cut at " << cut;
    EXPECT_EQ(clip_factor(c, std::sqrt(pieces)), clip_factor(c, std::sqrt(whole))) << "cut at " << cut;
  }
}

TEST(AdamW, ClipsByGlobalNormAndSkipsDecayWhereAsked) {
  config::OptimConfig c;
  c.clip_grad = 1.0;
  c.weight_decay = 0.5;
  std::vector<float> params = {1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> grads = {3.0f, 4.0f, 0.0f, 0.0f};  // norm 5
  AdamW opt(c, 4, {{0, 2, true}, {2, 2, false}});
  double norm = opt.step(params.data(), grads.data(), 0.1, 1);
  EXPECT_NEAR(norm, 5.0, 1e-6);
  // Clipped to norm 1: compare with a twin that does not clip, given the clipped gradient (the
  // factor times each element, as the update scales it).
  const float factor = clip_factor(c, norm);
  EXPECT_NEAR(factor, 0.2f, 1e-6f);
  std::vector<float> p2 = {1.0f, 1.0f, 1.0f, 1.0f}, g2 = {3.0f * factor, 4.0f * factor, 0.0f, 0.0f};
  config::OptimConfig unclipped = c;
  unclipped.clip_grad = 0.0;
  AdamW twin(unclipped, 4, {{0, 2, true}, {2, 2, false}});
  twin.step(p2.data(), g2.data(), 0.1, 1);
  EXPECT_FLOAT_EQ(params[0], p2[0]);
  EXPECT_FLOAT_EQ(params[1], p2[1]);
  EXPECT_FLOAT_EQ(opt.exp_avg()[0], twin.exp_avg()[0]);  // moments saw the clipped gradient
  // Zero gradient: only decay moves the parameter, and only in the decaying segment.
  EXPECT_NEAR(params[2], 1.0f, 1e-7);
  EXPECT_LT(params[0], 1.0f - 0.1f * 0.5f + 1e-3f);
}

// A segment's learning-rate scale (the MoE router's model.moe_router_lr_scale) multiplies the
// step's rate, weight decay included; the moments are the same.
TEST(AdamW, SegmentLearningRateScale) {
  config::OptimConfig c;
  c.weight_decay = 0.1;
  std::vector<float> params = {1.0f, 1.0f, -2.0f, -2.0f};
  const std::vector<float> grads = {0.5f, -0.25f, 0.5f, -0.25f};
  AdamW opt(c, 4, {{0, 2, true, 1.0f}, {2, 2, true, 0.25f}});
  for (int step = 1; step <= 3; ++step) opt.step(params.data(), grads.data(), 0.01, step);
  std::vector<float> ref = {-2.0f, -2.0f};
  AdamW quarter(c, 2, {{0, 2, true}});
  for (int step = 1; step <= 3; ++step) quarter.step(ref.data(), grads.data() + 2, 0.0025, step);
  EXPECT_FLOAT_EQ(params[2], ref[0]);
  EXPECT_FLOAT_EQ(params[3], ref[1]);
  EXPECT_GT(std::fabs(1.0f - params[0]), 3.0f * std::fabs(-2.0f - params[2]));
}

}  // namespace
}  // namespace loom::optim
