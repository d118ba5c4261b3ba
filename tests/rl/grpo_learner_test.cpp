// The GRPO learner on the shared trainer: steps on the same rollout groups at dp 2 (ZeRO 0 and
// 3), tp 2 with sequence parallelism, pp 2, recompute, tp 2 x pp 2, dp 2 x tp 2, cp 2 (ring and
// all-to-all) and dp 2 x cp 2 equal one rank (fp32: relative 1e-5 on each step's loss and the
// final parameters), and so do bf16 runs; the statistics are those of the loss; the reference
// policy is the run's starting point across a resume and from train.init_from; a step with zero
// advantages and no reference leaves the model unchanged; bad rollouts are refused with errors
// naming what to change; each grpo.loss_aggregation gives its formula's loss; grpo.mtp_loss_weight trains the
// multi-token prediction depths alone; packed rows (grpo.packing, the default) train as one
// sample per row does; grpo.minibatches updates against the policy each step started from;
// grpo.ratio_level sequence (GSPO) gives each sample its ratio and weight, in every layout.
#include "loom/rl/grpo_learner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include "../train/training_runs.h"
#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/kernels/types.h"
#include "loom/rl/grpo_loss.h"
#include "loom/rl/grpo_objective.h"
#include "loom/train/trainer.h"
#include "loom/train/run_ranks.h"
#include "support/emulated_cuda.h"
#include "support/emulated_precision.h"

namespace loom::rl {
namespace {

namespace fs = std::filesystem;

// Four prompts x 4 samples of random bytes; the first `prompt` tokens are the prompt (not
// trained), the rest sampled with a generation log-probability in [generation_logp - 1,
// generation_logp] (the untrained model's are near -log 256 = -5.55); rewards make 3 of the 4
// groups vary.
std::vector<RolloutGroup> make_groups(uint64_t seed, int prompt = 5, float generation_logp = -6.0f) {
  std::vector<RolloutGroup> groups;
  for (int g = 0; g < 4; ++g) {
    RolloutGroup group;
    group.prompt_index = g;
    for (int s = 0; s < 4; ++s) {
      Rollout r;
      const int length = 9 + static_cast<int>(philox4x32(seed, g * 4 + s, 99)[0] % 8);  // 9..16 tokens
      for (int k = 0; k < length; ++k) {
        const auto bits = philox4x32(seed, g * 4 + s, k);
        r.tokens.push_back(static_cast<int32_t>(bits[0] % 256));
        r.trained.push_back(k >= prompt ? 1 : 0);
        r.generation_logprobs.push_back(
            k >= prompt ? generation_logp - static_cast<float>(bits[1] % 1000) / 1000.0f : 0.0f);
      }
      r.reward = g == 3 ? 1.0 : static_cast<double>(philox4x32(seed, g, s + 50)[0] % 3);
      if (g < 3 && s == 0) r.reward = 5.0;  // never a zero-variance group by chance
      group.samples.push_back(r);
    }
    groups.push_back(group);
  }
  return groups;
}

class GrpoLearnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::temp_directory_path() / ("loom-grpo-learner-" + std::to_string(::getpid()))).string();
    fs::create_directories(root_);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static config::RunConfig config(const std::string& name, const std::vector<std::string>& overrides) {
    const std::string yaml =
        "run: {dir: " + root_ + "/" + name + "}\n" +
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n"
        "data: {tokenizer: byte, seq_len: 16}\n"
        "optim: {lr: 1.0e-3, warmup_steps: 1, clip_grad: 1.0, eps: 1.0e-5}\n"
        "train: {steps: 2, global_batch: 16, micro_batch: 4, threads: 1, seed: 1234}\n"
        "grpo: {kl_coeff: 0.05, importance_correction: tis, tis_cap: 2.0}\n"
        "log: {progress: false}\n";
    return config::parse_config(yaml, name, overrides);
  }

  // Learner steps up to train.steps = `steps` (step k on the groups of seed 6 + k, prompts of
  // `prompt` tokens, make_groups' `generation_logp`), then a checkpoint; rank 0's step metrics.
  static std::vector<LearnerStep> learn(const std::string& name, std::vector<std::string> overrides, int steps,
                                        int prompt = 5, float generation_logp = -6.0f) {
    overrides.push_back("train.steps=" + std::to_string(steps));
    const config::RunConfig c = config(name, overrides);
    std::ostringstream out;
    std::vector<LearnerStep> result;
    std::mutex mutex;
    train::run_on_ranks(c, out, [&](comm::Communicator& world) {
      GrpoLearner learner(c, world, out);
      std::vector<LearnerStep> mine;
      while (learner.weight_version() < steps)
        mine.push_back(learner.step(make_groups(7 + learner.weight_version(), prompt, generation_logp)));
      learner.save();
      learner.finish();
      if (world.rank() == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        result = mine;
      }
      return train::TrainSummary{};
    });
    return result;
  }

  // Steps of several updates (grpo.minibatches, grpo.epochs) in each of `layouts` with `common`
  // equal `reference`, the run `reference_name` on one rank: each step's loss, each update's loss
  // and gradient norm and the importance weights' mean within relative 1e-5, the KL within 1e-4
  // (step 1's, 2.5e-5, is of the later updates' moves of ~7e-3 in log-probability alone, whose fp32
  // rounding it carries at about 2e-5 relative: 1.7e-5 measured at tp 2), and the parameters and
  // moments after them within 1e-5; an update's loss that cancels to near 0 within 1e-6 absolute
  // (GSPO's first, 1.7e-5 of terms of 0.1 to 1, moved by 3.6e-7 at tp 2). The rollouts' generation
  // log-probabilities from `generation_logp`, as make_groups'.
  static void expect_updates_in_layouts(const std::string& prefix, const std::vector<std::string>& common,
                                        const std::vector<std::vector<std::string>>& layouts,
                                        const std::string& reference_name, const std::vector<LearnerStep>& reference,
                                        float generation_logp = -6.0f) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      SCOPED_TRACE("layout " + std::to_string(i));
      const std::string name = prefix + std::to_string(i);
      std::vector<std::string> overrides = layouts[i];
      overrides.insert(overrides.end(), common.begin(), common.end());
      const std::vector<LearnerStep> other =
          learn(name, overrides, static_cast<int>(reference.size()), 5, generation_logp);
      ASSERT_EQ(other.size(), reference.size());
      for (size_t s = 0; s < other.size(); ++s) {
        SCOPED_TRACE("step " + std::to_string(s + 1));
        const LearnerStep& r = reference[s];
        EXPECT_NEAR(other[s].loss, r.loss, 1e-5 * std::fabs(r.loss));
        ASSERT_EQ(other[s].update_losses.size(), r.update_losses.size());
        for (size_t u = 0; u < r.update_losses.size(); ++u) {
          const double loss = r.update_losses[u];
          EXPECT_NEAR(other[s].update_losses[u], loss, std::max(1e-5 * std::fabs(loss), 1e-6));
          EXPECT_NEAR(other[s].update_grad_norms[u], r.update_grad_norms[u], 1e-5 * r.update_grad_norms[u]);
        }
        EXPECT_NEAR(other[s].kl, r.kl, 1e-4 * r.kl);
        EXPECT_NEAR(other[s].importance_weight_mean, r.importance_weight_mean, 1e-5 * r.importance_weight_mean);
        EXPECT_NEAR(other[s].truncated_fraction, r.truncated_fraction, 1e-12);
        EXPECT_NEAR(other[s].masked_fraction, r.masked_fraction, 1e-12);
      }
      EXPECT_LE(train::testing::state_difference(root_, reference_name, name), 1e-5);
    }
  }

  static std::string root_;
};
std::string GrpoLearnerTest::root_;

// Each of two steps' loss, gradient norm, KL and importance statistics, and the parameters and
// Adam moments after them. (The fixture's optim.eps is 1e-5: Adam's first update g / (|g| + eps)
// of a gradient element near eps depends on its rounding. With 1e-8 that moved a few elements of
// a layer by 8e-5 relative between tp 2 and one rank while the moments agreed to 1e-5; with 1e-6,
// cp 2 moved layer 1's v_proj weight by 1.1e-5 here, and by 1.4e-5 with the depths' loss below,
// every loss, gradient norm and KL agreeing to 1e-5.)
TEST_F(GrpoLearnerTest, EveryLayoutEqualsOneRank) {
  const std::vector<LearnerStep> reference = learn("one", {}, 2);
  ASSERT_EQ(reference.size(), 2u);
  EXPECT_EQ(reference[0].kl, 0.0);  // step 1: the policy is the reference
  EXPECT_GT(reference[1].kl, 0.0);
  EXPECT_EQ(reference[0].samples, 16);
  EXPECT_EQ(reference[0].zero_variance_groups, 1);
  EXPECT_GT(reference[0].importance_weight_max, 2.0);  // exp(logp - gen): logp near -log 256, gen near -6.5
  EXPECT_GT(reference[0].truncated_fraction, 0.0);
  // The generation policy's log-probabilities lie about 1 below the model's: the mismatch shows.
  EXPECT_GT(reference[0].token_mult_prob_error, 2.0);
  EXPECT_GT(reference[0].generation_kl, 0.1);
  EXPECT_GT(reference[0].policy_kl, 0.1);
  EXPECT_GT(reference[0].js_divergence, 0.01);
  EXPECT_GT(reference[0].approx_entropy, 5.0);  // -e^(logp - gen) logp, logp near -log 256
  EXPECT_EQ(reference[0].to_json().at("js_divergence"), reference[0].js_divergence);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2"},                                                         // dp 2
      {"runtime.ranks=2", "parallel.zero=3"},                                      // dp 2, ZeRO-3
      {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},     // tp 2 + sp
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},     // pp 2
      {"model.recompute=true"},
      {"runtime.ranks=4", "parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"},  // tp 2 x pp 2
      {"runtime.ranks=4", "parallel.tp=2", "parallel.zero=3"},                                      // dp 2 x tp 2, ZeRO-3
      {"runtime.ranks=2", "parallel.cp=2"},                                        // cp 2, ring attention
      {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=a2a"},                // cp 2, all-to-all
      {"runtime.ranks=4", "parallel.cp=2", "parallel.zero=1"},                     // dp 2 x cp 2, ZeRO-1
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const std::string name = "layout" + std::to_string(i);
    const std::vector<LearnerStep> other = learn(name, layouts[i], 2);
    ASSERT_EQ(other.size(), reference.size());
    for (size_t s = 0; s < other.size(); ++s) {
      EXPECT_NEAR(other[s].loss, reference[s].loss, 1e-5 * std::fabs(reference[s].loss)) << "step " << s + 1;
      EXPECT_NEAR(other[s].grad_norm, reference[s].grad_norm, 1e-5 * reference[s].grad_norm) << "step " << s + 1;
      EXPECT_EQ(other[s].trained_tokens, reference[s].trained_tokens);
      EXPECT_NEAR(other[s].kl, reference[s].kl, 1e-5 * reference[s].kl + 1e-12);
      EXPECT_NEAR(other[s].importance_weight_max, reference[s].importance_weight_max,
                  1e-5 * reference[s].importance_weight_max);
      EXPECT_NEAR(other[s].truncated_fraction, reference[s].truncated_fraction, 1e-12);
      EXPECT_NEAR(other[s].generation_kl, reference[s].generation_kl, 1e-5 * reference[s].generation_kl);
      EXPECT_NEAR(other[s].approx_entropy, reference[s].approx_entropy, 1e-5 * reference[s].approx_entropy);
    }
    EXPECT_LE(train::testing::state_difference(root_, "one", name), 1e-5);
  }
}

// grpo.loss_aggregation on the first step, where the policy is the one that generated the old
// log-probabilities (r = 1) and, without a reference or a correction, each token's loss is -A of
// its sample: the step's loss is the formula's, computed here from the groups' rewards
// (group_advantages) and each sample's trained tokens (its sampled tokens but the first); a
// constant factor scales the gradient as it scales the loss; data and pipeline parallelism
// average the samples as one rank does.
TEST_F(GrpoLearnerTest, LossAggregationsAreTheirFormulas) {
  double token_sum = 0.0, sample_sum = 0.0;  // sum over tokens of -A; over samples of -A
  int64_t tokens = 0, samples = 0;
  for (const RolloutGroup& group : make_groups(7)) {
    std::vector<double> rewards;
    for (const Rollout& r : group.samples) rewards.push_back(r.reward);
    const GroupAdvantages advantages = group_advantages(rewards, AdvantageOptions{});
    for (size_t i = 0; i < group.samples.size(); ++i) {
      const int64_t trained = static_cast<int64_t>(group.samples[i].tokens.size()) - 5;
      token_sum -= static_cast<double>(trained) * advantages.advantages[i];
      sample_sum -= advantages.advantages[i];
      tokens += trained;
      samples += 1;
    }
  }
  const std::vector<std::string> plain = {"grpo.kl_coeff=0", "grpo.importance_correction=none"};
  auto first_step = [&](const std::string& name, const std::string& mode, std::vector<std::string> layout = {}) {
    layout.insert(layout.end(), plain.begin(), plain.end());
    layout.push_back("grpo.loss_aggregation=" + mode);
    return learn(name, layout, 1).at(0);
  };
  const LearnerStep token_mean = first_step("agg-token", "token_mean");
  const LearnerStep sample_mean = first_step("agg-sample", "seq_mean_token_mean");
  const LearnerStep sum_norm = first_step("agg-sum-norm", "seq_mean_token_sum_norm");
  // The rows carry each advantage as a float: relative 1e-6.
  auto expect_loss = [](double loss, double expected) { EXPECT_NEAR(loss, expected, 1e-6 * std::fabs(expected)); };
  EXPECT_EQ(token_mean.trained_tokens, tokens);
  expect_loss(token_mean.loss, token_sum / static_cast<double>(tokens));
  expect_loss(sample_mean.loss, sample_sum / static_cast<double>(samples));
  // grpo.max_tokens (32) x grpo.max_turns (1) tokens per sample.
  expect_loss(sum_norm.loss, token_sum / static_cast<double>(samples * 32));
  EXPECT_GT(std::fabs(sample_mean.loss - token_mean.loss), 1e-3);
  const double factor = static_cast<double>(tokens) / static_cast<double>(samples * 32);
  EXPECT_NEAR(sum_norm.grad_norm, factor * token_mean.grad_norm, 1e-5 * sum_norm.grad_norm);
  for (const auto& [name, layout] :
       {std::pair<std::string, std::vector<std::string>>{"agg-dp2", {"runtime.ranks=2"}},
        {"agg-pp2", {"runtime.ranks=2", "parallel.pp=2"}},
        {"agg-cp2", {"runtime.ranks=2", "parallel.cp=2"}}}) {
    SCOPED_TRACE(name);
    const LearnerStep other = first_step(name, "seq_mean_token_mean", layout);
    EXPECT_NEAR(other.loss, sample_mean.loss, 1e-5 * std::fabs(sample_mean.loss));
    EXPECT_NEAR(other.grad_norm, sample_mean.grad_norm, 1e-5 * sample_mean.grad_norm);
    EXPECT_LE(train::testing::state_difference(root_, "agg-sample", name), 1e-5);
  }
}

// runtime.device=cuda on the emulated device (tests/support/emulated_cuda.h: the CPU kernels
// behind memory the host cannot touch): the learner's steps (its reference and old-policy
// passes, the objective's log-probabilities going to the host and its gradients coming back)
// equal the same steps on the CPU bit for bit, alone, at tp 2 x dp 2, and with two updates a step
// (grpo.minibatches, whose second update reads the old-policy pass's log-probabilities).
TEST_F(GrpoLearnerTest, OnTheDeviceEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_cuda();
  const std::vector<std::vector<std::string>> layouts = {
      {}, {"runtime.ranks=4", "parallel.tp=2", "parallel.sequence_parallel=true"}, {"grpo.minibatches=2"}};
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const std::string cpu = "cpu" + std::to_string(i), gpu = "device" + std::to_string(i);
    const std::vector<LearnerStep> expected = learn(cpu, layouts[i], 2);
    std::vector<std::string> on_device = layouts[i];
    on_device.push_back("runtime.device=cuda");
    const std::vector<LearnerStep> got = learn(gpu, on_device, 2);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_EQ(got[s].loss, expected[s].loss) << "step " << s + 1;
      EXPECT_EQ(got[s].grad_norm, expected[s].grad_norm) << "step " << s + 1;
      EXPECT_EQ(got[s].kl, expected[s].kl) << "step " << s + 1;
      EXPECT_EQ(got[s].importance_weight_max, expected[s].importance_weight_max) << "step " << s + 1;
      EXPECT_EQ(got[s].truncated_fraction, expected[s].truncated_fraction) << "step " << s + 1;
    }
    EXPECT_EQ(train::testing::state_difference(root_, cpu, gpu), 0.0);
  }
  // What a refit over the communicator sends (parameter_shards): host bytes, the CPU's.
  auto shards_of = [&](const std::string& name, const std::vector<std::string>& overrides) {
    const config::RunConfig c = config(name, overrides);
    std::ostringstream out;
    std::map<std::string, std::vector<float>> shards;
    train::run_on_ranks(c, out, [&](comm::Communicator& world) {
      GrpoLearner learner(c, world, out);
      learner.step(make_groups(7));
      for (const ckpt::TensorRef& ref : learner.trainer().parameter_shards()) {
        const auto* data = static_cast<const float*>(ref.data);
        const ckpt::Slice slice = ref.slice.empty() ? ckpt::full_slice(ref.global_shape) : ref.slice;
        shards[ref.name].assign(data, data + ckpt::slice_numel(slice));
      }
      learner.finish();
      return train::TrainSummary{};
    });
    return shards;
  };
  const auto cpu_shards = shards_of("refit-cpu", {});
  EXPECT_FALSE(cpu_shards.empty());
  EXPECT_EQ(shards_of("refit-device", {"runtime.device=cuda"}), cpu_shards);
}

// bf16 GEMMs on the device with their weight casts kept through each step's micro-batches: the
// reference policy's pass swaps its parameters into the same addresses before the step's scope
// opens (weight_cast_cache.h), so its casts are never the step's, nor the step's its.
TEST_F(GrpoLearnerTest, Bf16OnTheDeviceWithCachedWeightCastsAndAReferenceEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_cuda();
  const std::vector<std::string> bf16 = {"precision.recipe=bf16", "model.recompute=true"};
  std::vector<std::string> on_device = bf16;
  on_device.push_back("runtime.device=cuda");
  const std::vector<LearnerStep> expected = learn("bf16-cpu", bf16, 2);
  ::loom::testing::reset_emulated_weight_cast_counts();
  const std::vector<LearnerStep> got = learn("bf16-device", on_device, 2);
  EXPECT_GT(::loom::testing::emulated_weight_cast_counts().reused, 0);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t s = 0; s < got.size(); ++s) {
    EXPECT_EQ(got[s].loss, expected[s].loss) << "step " << s + 1;
    EXPECT_EQ(got[s].kl, expected[s].kl) << "step " << s + 1;
    if (s > 0) {
      EXPECT_NE(got[s].kl, 0.0) << "step " << s + 1;  // the policy moved from the reference
    }
  }
  EXPECT_EQ(train::testing::state_difference(root_, "bf16-cpu", "bf16-device"), 0.0);
}

// bf16 GEMMs: data and tensor parallelism still compute one rank's bf16 step (its losses and
// gradient norms; the bf16 rounding of each GEMM is the same on every layout's rows).
TEST_F(GrpoLearnerTest, Bf16LayoutsEqualOneRank) {
  const std::vector<LearnerStep> reference = learn("bf16-one", {"precision.recipe=bf16"}, 2);
  EXPECT_GT(reference[1].kl, 0.0);
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"runtime.ranks=2"}, std::vector<std::string>{"runtime.ranks=2", "parallel.pp=2"}}) {
    std::vector<std::string> overrides = layout;
    overrides.push_back("precision.recipe=bf16");
    const std::vector<LearnerStep> other = learn("bf16-" + std::to_string(layout.size()), overrides, 2);
    ASSERT_EQ(other.size(), reference.size());
    for (size_t s = 0; s < other.size(); ++s) {
      EXPECT_NEAR(other[s].loss, reference[s].loss, 1e-5 * std::fabs(reference[s].loss)) << "step " << s + 1;
      EXPECT_NEAR(other[s].grad_norm, reference[s].grad_norm, 1e-5 * reference[s].grad_norm) << "step " << s + 1;
    }
  }
}

// The reference policy is where the run started: a resumed run keeps the seed's initialisation
// as its reference (its second step is the uninterrupted run's, bit for bit), and a run started
// from train.init_from takes that checkpoint's parameters (its first step's KL is 0).
TEST_F(GrpoLearnerTest, TheReferenceIsTheRunsStartingPoint) {
  const std::vector<LearnerStep> whole = learn("whole", {}, 2);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(learn("split", {}, 1).size(), 1u);
  const std::vector<LearnerStep> resumed = learn("split", {"train.resume=true"}, 2);
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].step, 2);
  EXPECT_EQ(resumed[0].kl, whole[1].kl);
  EXPECT_EQ(resumed[0].loss, whole[1].loss);
  EXPECT_GT(resumed[0].kl, 0.0);
  const std::vector<LearnerStep> tuned = learn("tuned", {"train.init_from=" + root_ + "/whole/checkpoints"}, 1);
  ASSERT_EQ(tuned.size(), 1u);
  EXPECT_EQ(tuned[0].kl, 0.0);
  EXPECT_NE(tuned[0].loss, whole[0].loss);  // other parameters than the seed's
}

// Zero advantages everywhere and no reference: the loss and every gradient are 0, and AdamW
// without weight decay leaves the parameters as they were.
TEST_F(GrpoLearnerTest, ZeroAdvantagesWithoutReferenceChangeNothing) {
  const config::RunConfig c = config("still", {"grpo.kl_coeff=0", "optim.weight_decay=0", "train.steps=1"});
  std::vector<RolloutGroup> groups = make_groups(7);
  for (RolloutGroup& g : groups)
    for (Rollout& r : g.samples) r.reward = 1.0;
  std::ostringstream out;
  train::run_on_ranks(c, out, [&](comm::Communicator& world) {
    GrpoLearner learner(c, world, out);
    auto host_copy = [&] {
      const Tensor copy = learner.trainer().parameter_copy();
      return std::vector<float>(copy.data<float>(), copy.data<float>() + copy.numel());  // a CPU run
    };
    const std::vector<float> before = host_copy();
    const LearnerStep step = learner.step(groups);
    EXPECT_EQ(step.loss, 0.0);
    EXPECT_EQ(step.zero_variance_groups, 4);
    EXPECT_EQ(step.grad_norm, 0.0);
    EXPECT_EQ(host_copy(), before);
    EXPECT_EQ(learner.weight_version(), 1);
    learner.finish();
    return train::TrainSummary{};
  });
}

// grpo.mtp_loss_weight: the multi-token prediction depths learn to draft the rollouts' response
// tokens (each depth's cross-entropy on the targets k ahead), and only they learn from it.
// Without clipping (whose global norm counts the depths' gradients), every other tensor and its
// moments end as in a run that leaves the depths alone, bit for bit, with the same losses, while
// the depths move; each step reports each depth's loss; tp 2 with sequence parallelism, pp 2, cp 2 and
// dp 2 with ZeRO-3 equal one rank; the key is refused for a model without depths.
// One sample per row: with clipping off, tp 2's reduction order leaves layer 0's down projection's
// first moment 7e-6 of its largest element from one rank's after three steps, and packed rows
// 1.2e-5 (measured), over this test's 1e-5; packed rows with the depths' loss, on one rank, at
// tp 2 and at cp 2, are PackedRowsTrainAsOneSamplePerRowInEveryLayout's.
TEST_F(GrpoLearnerTest, TheDepthsDraftLossTrainsTheDepthsAloneInEveryLayout) {
  const std::vector<std::string> depths = {"model.mtp_depths=2", "optim.clip_grad=0", "grpo.packing=false"};
  auto drafting = [&](std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), depths.begin(), depths.end());
    overrides.push_back("grpo.mtp_loss_weight=0.5");
    return overrides;
  };
  const std::vector<LearnerStep> left_alone = learn("depths-alone", depths, 3);
  const std::vector<LearnerStep> reference = learn("depths-one", drafting({}), 3);
  ASSERT_EQ(reference.size(), 3u);
  for (size_t s = 0; s < reference.size(); ++s) {
    EXPECT_TRUE(left_alone[s].mtp_losses.empty());
    ASSERT_EQ(reference[s].mtp_losses.size(), 2u);
    EXPECT_GT(reference[s].mtp_losses[1], 1.0);  // random bytes: near log 256
    EXPECT_EQ(reference[s].to_json().at("mtp_loss_2").get<double>(), reference[s].mtp_losses[1]);
    EXPECT_EQ(reference[s].loss, left_alone[s].loss) << "step " << s + 1;
  }
  auto of_depths = [](bool wanted) {
    return [wanted](const ckpt::LoadedCheckpoint& c) {
      std::vector<std::string> names;
      for (const std::string& name : c.names()) {
        if ((name.find("mtp.layers.") != std::string::npos) == wanted) names.push_back(name);
      }
      return names;
    };
  };
  EXPECT_EQ(train::testing::checkpoint_difference(root_, "depths-alone", "depths-one", of_depths(false)), 0.0);
  EXPECT_GT(train::testing::checkpoint_difference(root_, "depths-alone", "depths-one", of_depths(true)), 1e-4);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},
      {"runtime.ranks=2", "parallel.zero=3"},
      {"runtime.ranks=2", "parallel.cp=2"},
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const std::string name = "depths-layout" + std::to_string(i);
    const std::vector<LearnerStep> other = learn(name, drafting(layouts[i]), 3);
    ASSERT_EQ(other.size(), reference.size());
    for (size_t s = 0; s < other.size(); ++s) {
      EXPECT_NEAR(other[s].loss, reference[s].loss, 1e-5 * std::fabs(reference[s].loss)) << "step " << s + 1;
      ASSERT_EQ(other[s].mtp_losses.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_NEAR(other[s].mtp_losses[k], reference[s].mtp_losses[k], 1e-5 * reference[s].mtp_losses[k]);
      }
    }
    EXPECT_LE(train::testing::state_difference(root_, "depths-one", name), 1e-5);
  }
  try {
    config("depths-none", {"grpo.mtp_loss_weight=0.5"});
    ADD_FAILURE() << "grpo.mtp_loss_weight without model.mtp_depths was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grpo.mtp_loss_weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.mtp_depths"), std::string::npos) << e.what();
  }
}

// grpo.packing: the samples packed into rows of 32 (documents of their own, about two a row) train
// as one sample per row does: each step's loss, gradient norm, KL and importance weights and the
// parameters and moments after two steps within fp32 rounding (relative 1e-5), alone, under
// seq_mean_token_mean (each sample's factor from its size, which every target carries), with the
// depths' draft loss (documents end the depths' shifted rows: with one-token prompts they would
// otherwise reach the next sample's trained tokens), and at tp 2 + sp (also with the depths), pp 2
// (1F1B, and interleaved over 4 layers, whose steps take multiples of 8 rows), dp 2 ZeRO-3 and
// cp 2 (with the depths and seq_mean_token_mean: each rank holds chunks of every sample); the
// packed steps take fewer rows.
TEST_F(GrpoLearnerTest, PackedRowsTrainAsOneSamplePerRowInEveryLayout) {
  struct Case {
    std::vector<std::string> overrides;
    int prompt = 5;  // tokens
  };
  const std::vector<Case> cases = {
      {{}},
      {{"grpo.loss_aggregation=seq_mean_token_mean"}},
      {{"model.mtp_depths=2", "grpo.mtp_loss_weight=0.5"}},
      {{"model.mtp_depths=2", "grpo.mtp_loss_weight=0.5"}, 1},
      {{"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
      {{"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true", "model.mtp_depths=2",
        "grpo.mtp_loss_weight=0.5"}},
      {{"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"}},
      {{"runtime.ranks=2", "model.layers=4", "parallel.pp=2", "parallel.pipeline_schedule=interleaved",
        "parallel.virtual_stages=2"}},
      {{"runtime.ranks=2", "parallel.zero=3"}},
      {{"runtime.ranks=2", "parallel.cp=2", "grpo.loss_aggregation=seq_mean_token_mean", "model.mtp_depths=2",
        "grpo.mtp_loss_weight=0.5"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    std::vector<std::string> overrides = cases[i].overrides;
    overrides.push_back("data.seq_len=32");
    const std::string padded_name = "padded" + std::to_string(i), packed_name = "packed" + std::to_string(i);
    std::vector<std::string> one_per_row = overrides;
    one_per_row.push_back("grpo.packing=false");
    const std::vector<LearnerStep> padded = learn(padded_name, one_per_row, 2, cases[i].prompt);
    const std::vector<LearnerStep> packed = learn(packed_name, overrides, 2, cases[i].prompt);
    ASSERT_EQ(padded.size(), 2u);
    ASSERT_EQ(packed.size(), 2u);
    for (size_t s = 0; s < packed.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      EXPECT_EQ(padded[s].rows, 16);
      EXPECT_LE(packed[s].rows, 12);  // 16 samples of 8 to 15 slots, mostly two a row
      EXPECT_GT(packed[s].packing_efficiency, 1.25 * padded[s].packing_efficiency);
      EXPECT_EQ(packed[s].samples, padded[s].samples);
      EXPECT_EQ(packed[s].trained_tokens, padded[s].trained_tokens);
      EXPECT_NEAR(packed[s].loss, padded[s].loss, 1e-5 * std::fabs(padded[s].loss));
      EXPECT_NEAR(packed[s].grad_norm, padded[s].grad_norm, 1e-5 * padded[s].grad_norm);
      EXPECT_NEAR(packed[s].kl, padded[s].kl, 1e-5 * padded[s].kl + 1e-12);
      EXPECT_NEAR(packed[s].importance_weight_max, padded[s].importance_weight_max,
                  1e-5 * padded[s].importance_weight_max);
      ASSERT_EQ(packed[s].mtp_losses.size(), padded[s].mtp_losses.size());
      for (size_t k = 0; k < packed[s].mtp_losses.size(); ++k) {
        EXPECT_NEAR(packed[s].mtp_losses[k], padded[s].mtp_losses[k], 1e-5 * padded[s].mtp_losses[k]);
      }
    }
    EXPECT_LE(train::testing::state_difference(root_, padded_name, packed_name), 1e-5);
  }
}

// The depths' draft loss on the emulated device (fp32, and bf16 where the head's and the depths'
// GEMMs run through the precision recipe without the head weight's gradient) equals the CPU's
// steps bit for bit.
TEST_F(GrpoLearnerTest, TheDepthsDraftLossOnTheDeviceEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_cuda();
  for (const std::string recipe : {"fp32", "bf16"}) {
    SCOPED_TRACE(recipe);
    const std::vector<std::string> drafting = {"model.mtp_depths=2", "grpo.mtp_loss_weight=0.5",
                                               "precision.recipe=" + recipe};
    std::vector<std::string> on_device = drafting;
    on_device.push_back("runtime.device=cuda");
    const std::vector<LearnerStep> expected = learn("depths-cpu-" + recipe, drafting, 2);
    const std::vector<LearnerStep> got = learn("depths-device-" + recipe, on_device, 2);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_EQ(got[s].loss, expected[s].loss) << "step " << s + 1;
      EXPECT_EQ(got[s].mtp_losses, expected[s].mtp_losses) << "step " << s + 1;
      EXPECT_EQ(got[s].grad_norm, expected[s].grad_norm) << "step " << s + 1;
    }
    EXPECT_EQ(train::testing::state_difference(root_, "depths-cpu-" + recipe, "depths-device-" + recipe), 0.0);
  }
}

// grpo.minibatches = 2: each step takes two optimizer updates, on the first and the second half
// of its samples (groups 0-1, then 2-3). The first update is a step on the first half alone (its
// loss and gradient norm, bit for bit); the second's ratios are to the log-probabilities of the
// parameters the step started from: the step's raw importance weights exp(old - gen) are those of
// one update on every sample (the starting policy's log-probabilities for every token), while its
// KL to the reference (the starting point) is above 0 and tight clips clip tokens that one update
// never clips (its ratios are 1); dp 2, dp 2 with ZeRO-3, tp 2 + sp, pp 2 and cp 2 equal one rank;
// a run resumed after its first step equals one that was not, bit for bit. (optim.eps is 1e-4: at
// 1e-6, tp 2's reduction order moved an element of layer 0's v_proj weight, whose gradient is near
// eps, by 1.8e-5 of the tensor's largest after the first step's two updates, and by 1.2e-6 at 1e-4;
// measured.)
TEST_F(GrpoLearnerTest, MinibatchesUpdateAgainstTheStepsStartingPolicy) {
  const std::vector<std::string> one = {"optim.eps=1e-4"}, two = {"optim.eps=1e-4", "grpo.minibatches=2"};
  const std::vector<LearnerStep> reference = learn("mb-one", two, 2);
  const std::vector<LearnerStep> whole = learn("mb-whole", one, 1);
  ASSERT_EQ(reference.size(), 2u);
  const LearnerStep& first = reference[0];
  EXPECT_EQ(first.updates, 2);
  ASSERT_EQ(first.update_losses.size(), 2u);
  EXPECT_EQ(first.to_json().at("update_losses").size(), 2u);
  EXPECT_EQ(first.trained_tokens, whole[0].trained_tokens);
  EXPECT_EQ(whole[0].kl, 0.0);
  EXPECT_GT(first.kl, 0.0);
  EXPECT_NEAR(first.importance_weight_mean, whole[0].importance_weight_mean, 1e-6 * whole[0].importance_weight_mean);
  EXPECT_NEAR(first.importance_weight_min, whole[0].importance_weight_min, 1e-6 * whole[0].importance_weight_min);
  EXPECT_NEAR(first.importance_weight_max, whole[0].importance_weight_max, 1e-6 * whole[0].importance_weight_max);
  EXPECT_NEAR(first.truncated_fraction, whole[0].truncated_fraction, 1e-12);
  {  // the first half alone
    const config::RunConfig c = config("mb-half", one);
    std::vector<RolloutGroup> half = make_groups(7);
    half.resize(2);
    std::ostringstream out;
    train::run_on_ranks(c, out, [&](comm::Communicator& world) {
      GrpoLearner learner(c, world, out);
      const LearnerStep step = learner.step(half);
      EXPECT_EQ(step.updates, 1);
      EXPECT_TRUE(step.update_losses.empty());
      EXPECT_EQ(first.update_losses[0], step.loss);
      EXPECT_EQ(first.update_grad_norms[0], step.grad_norm);
      learner.finish();
      return train::TrainSummary{};
    });
  }
  const std::vector<std::string> tight = {"optim.eps=1e-4", "grpo.clip_low=0.001", "grpo.clip_high=0.001"};
  std::vector<std::string> tight_two = tight;
  tight_two.push_back("grpo.minibatches=2");
  const LearnerStep clipped = learn("mb-tight", tight_two, 1).at(0);
  const LearnerStep unclipped = learn("mb-tight-whole", tight, 1).at(0);
  EXPECT_EQ(unclipped.clip_low_fraction + unclipped.clip_high_fraction, 0.0);
  EXPECT_GT(clipped.clip_low_fraction + clipped.clip_high_fraction, 0.0);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2"},
      {"runtime.ranks=2", "parallel.zero=3"},
      {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},
      {"runtime.ranks=2", "parallel.cp=2"},
  };
  expect_updates_in_layouts("mb-layout", two, layouts, "mb-one", reference);
  ASSERT_EQ(learn("mb-split", two, 1).size(), 1u);
  std::vector<std::string> resume = two;
  resume.push_back("train.resume=true");
  const std::vector<LearnerStep> resumed = learn("mb-split", resume, 2);
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].loss, reference[1].loss);
  EXPECT_EQ(resumed[0].update_grad_norms, reference[1].update_grad_norms);
  EXPECT_EQ(train::testing::state_difference(root_, "mb-one", "mb-split"), 0.0);
}

// grpo.epochs = 2: a step passes over its samples twice. The first update is the one-update step,
// bit for bit; the second, on the same rows with the moved policy, has a lower loss, its ratios to
// the starting policy (the raw importance weights those of the one-update step, the KL above 0);
// with grpo.minibatches 2 (four updates) dp 2 with ZeRO-3, pp 2 and cp 2 equal one rank.
TEST_F(GrpoLearnerTest, EpochsPassOverTheSamplesAgainAgainstTheStepsStartingPolicy) {
  const std::vector<std::string> one = {"optim.eps=1e-4"}, twice = {"optim.eps=1e-4", "grpo.epochs=2"};
  const LearnerStep whole = learn("ep-whole", one, 1).at(0);
  const LearnerStep first = learn("ep-twice", twice, 1).at(0);
  EXPECT_EQ(first.updates, 2);
  ASSERT_EQ(first.update_losses.size(), 2u);
  EXPECT_EQ(first.update_losses[0], whole.loss);
  EXPECT_EQ(first.update_grad_norms[0], whole.grad_norm);
  EXPECT_LT(first.update_losses[1], first.update_losses[0]);
  EXPECT_EQ(first.trained_tokens, 2 * whole.trained_tokens);
  EXPECT_GT(first.kl, 0.0);
  EXPECT_NEAR(first.importance_weight_mean, whole.importance_weight_mean, 1e-6 * whole.importance_weight_mean);
  EXPECT_NEAR(first.importance_weight_max, whole.importance_weight_max, 1e-6 * whole.importance_weight_max);
  std::vector<std::string> four = twice;
  four.push_back("grpo.minibatches=2");
  const std::vector<LearnerStep> reference = learn("ep-four", four, 2);
  ASSERT_EQ(reference.size(), 2u);
  EXPECT_EQ(reference[0].updates, 4);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2", "parallel.zero=3"},
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},
      {"runtime.ranks=2", "parallel.cp=2"},
  };
  expect_updates_in_layouts("ep-layout", four, layouts, "ep-four", reference);
}

// A batch of 4 rows of 16 slots with five packed samples (slots: trained from the `prompt`-th
// on; each sample's advantage; the rest of a row a padding document): rows 0 (6 + 7 + 3 padding),
// 1 (16), 2 (5 + 5 + 6 padding), 3 (padding alone). Generation log-probabilities are set later.
struct PackedSample {
  int row, slots, prompt;
  float advantage;
};
const std::vector<PackedSample> kPackedSamples = {
    {0, 6, 2, 1.5f}, {0, 7, 1, -0.5f}, {1, 16, 4, 0.75f}, {2, 5, 1, -1.25f}, {2, 5, 2, 2.0f}};

train::TokenBatch packed_batch() {
  train::TokenBatch b;
  b.resize(4, 16);
  b.positions.assign(64, 0);
  b.documents.assign(64, 0);
  b.advantages.assign(64, 0.0f);
  b.generation_logprobs.assign(64, 0.0f);
  b.sample_targets.assign(64, 0);
  std::vector<int> used(4, 0), documents(4, 0);
  for (size_t i = 0; i < 64; ++i) {
    b.inputs[i] = static_cast<int32_t>(philox4x32(3, static_cast<uint64_t>(i), 0)[0] % 256);
    b.targets[i] = kernels::kIgnoreIndex;
    b.loss_weights[i] = 0.0f;
  }
  for (const PackedSample& sample : kPackedSamples) {
    const int first = sample.row * 16 + used[static_cast<size_t>(sample.row)];
    for (int k = 0; k < sample.slots; ++k) {
      const size_t i = static_cast<size_t>(first + k);
      b.positions[i] = k;
      b.documents[i] = documents[static_cast<size_t>(sample.row)];
      b.advantages[i] = sample.advantage;
      b.sample_targets[i] = sample.slots - sample.prompt;
      if (k < sample.prompt) continue;
      b.targets[i] = static_cast<int32_t>(philox4x32(4, i, 0)[0] % 256);
      b.loss_weights[i] = 1.0f;
    }
    used[static_cast<size_t>(sample.row)] += sample.slots;
    ++documents[static_cast<size_t>(sample.row)];
  }
  for (int row = 0; row < 4; ++row) {  // each row's padding: a document of its own
    for (int k = used[static_cast<size_t>(row)]; k < 16; ++k) {
      b.positions[static_cast<size_t>(row * 16 + k)] = k - used[static_cast<size_t>(row)];
      b.documents[static_cast<size_t>(row * 16 + k)] = documents[static_cast<size_t>(row)];
    }
  }
  return b;
}

// grpo.ratio_level sequence on the objective itself over packed_batch (tis at cap 2, no KL), its
// old policy the model's log-probabilities: at the first update every trained token's gradient is
// its sample's factor x w (-A) with w = exp(sum(logp - gen)) over the sample (every s is 1); at a
// later update, the current log-probabilities moved from the old ones by up to 0.1, factor x
// w (-A s) with s = exp(mean(logp - old)) and w = exp(sum(old - gen)), capped at 2 where above:
// the same evaluated a row at a time as all rows at once. A part of a row is refused.
TEST_F(GrpoLearnerTest, GspoObjectiveGivesEachSampleItsRatioAndWeight) {
  const config::RunConfig c = config("gspo-objective", {"grpo.kl_coeff=0", "grpo.ratio_level=sequence",
                                                        "grpo.loss_aggregation=seq_mean_token_mean"});
  std::ostringstream out;
  train::run_on_ranks(c, out, [&](comm::Communicator& world) {
    GrpoLearner learner(c, world, out);
    train::TokenBatch batch = packed_batch();
    const std::vector<float> old = learner.trainer().target_logprobs(batch, nullptr);
    std::vector<float> logp(64, 0.0f);
    int64_t tokens = 0;
    for (size_t i = 0; i < 64; ++i) {
      if (batch.targets[i] == kernels::kIgnoreIndex) continue;
      ++tokens;
      auto move = [&](uint64_t key) {
        return 0.2f * (static_cast<float>(philox4x32(key, i, 0)[0] % 1000) / 1e3f - 0.5f);
      };
      batch.generation_logprobs[i] = old[i] + move(5);
      logp[i] = old[i] + move(6);
    }
    const int64_t samples = static_cast<int64_t>(kPackedSamples.size());
    GrpoObjective objective(LossOptions::from_config(c.grpo), nullptr);
    objective.set_step_totals({{tokens, samples}, {tokens, samples}}, 2);
    objective.before_updates(learner.trainer(), batch, 1);
    // The expected gradients: each sample's slots, its sums, s and w.
    auto expected = [&](int update) {
      std::vector<double> gradient(64, 0.0);
      for (size_t n = 0; n < kPackedSamples.size(); ++n) {
        const PackedSample& sample = kPackedSamples[n];
        size_t first = static_cast<size_t>(sample.row * 16);
        for (size_t m = 0; m < n; ++m) first += kPackedSamples[m].row == sample.row ? kPackedSamples[m].slots : 0;
        double log_ratio = 0.0, log_weight = 0.0;
        for (int k = sample.prompt; k < sample.slots; ++k) {
          const size_t i = first + static_cast<size_t>(k);
          const double before = update == 0 ? logp[i] : old[i];
          log_ratio += logp[i] - before;
          log_weight += before - batch.generation_logprobs[i];
        }
        const int trained = sample.slots - sample.prompt;
        const double s = std::exp(log_ratio / trained), w = std::min(2.0, std::exp(log_weight));
        const double factor = static_cast<double>(tokens) / (static_cast<double>(trained) * samples);
        for (int k = sample.prompt; k < sample.slots; ++k)
          gradient[first + static_cast<size_t>(k)] = factor * w * -sample.advantage * s;
      }
      return gradient;
    };
    auto expect_gradients = [&](const std::vector<float>& got, const std::vector<double>& want) {
      for (size_t i = 0; i < 64; ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i])) << "slot " << i;
    };
    objective.prepare(learner.trainer(), batch, 0);
    std::vector<float> gradient(64);
    objective.evaluate(batch.targets.data(), logp.data(), 64, gradient.data());
    const std::vector<double> first_update = expected(0);
    expect_gradients(gradient, first_update);
    objective.prepare(learner.trainer(), batch, 1);
    for (int row = 0; row < 4; ++row) {
      objective.evaluate(batch.targets.data() + row * 16, logp.data() + row * 16, 16, gradient.data() + row * 16);
    }
    const std::vector<double> later = expected(1);
    expect_gradients(gradient, later);
    std::vector<float> all_rows(64);
    objective.evaluate(batch.targets.data(), logp.data(), 64, all_rows.data());
    EXPECT_EQ(all_rows, gradient);
    // The later update's weights differ from the first's, and its ratios from 1.
    EXPECT_GT(std::fabs(later[20] / first_update[20] - 1.0), 1e-3);
    EXPECT_THROW(objective.evaluate(batch.targets.data() + 8, logp.data() + 8, 16, gradient.data()), Error);
    learner.finish();
    return train::TrainSummary{};
  });
}

// GSPO in the learner: with no importance correction its first update is token-level GRPO's
// (seq_mean_token_mean both), bit for bit, every ratio 1 at the step's start, and its second
// differs; with tis and two updates a step, dp 2 with ZeRO-3, tp 2 + sp, pp 2, cp 2 (ring and
// all-to-all, each rank's sums over its chunks of every sample added over the pair) and
// dp 2 x cp 2 equal one rank. There the rollouts' generation log-probabilities lie around the
// model's (a sample's weight, exp of a sum over its tokens, then between about 0.5 and 2, tis
// capping some at 1.5): with make_groups' usual ones, a log-probability 1 below the model's a
// token, the weights reach e^10 and the loss is a sum of terms a hundred times its size.
TEST_F(GrpoLearnerTest, GspoTrainsInEveryLayoutAsOneRank) {
  const std::vector<std::string> sample_mean = {"optim.eps=1e-4", "grpo.minibatches=2",
                                                "grpo.loss_aggregation=seq_mean_token_mean"};
  std::vector<std::string> plain = sample_mean, gspo_plain = sample_mean;
  plain.push_back("grpo.importance_correction=none");
  gspo_plain.push_back("grpo.importance_correction=none");
  gspo_plain.push_back("grpo.ratio_level=sequence");
  const LearnerStep token_level = learn("gspo-token", plain, 1).at(0);
  const LearnerStep sequence_level = learn("gspo-plain", gspo_plain, 1).at(0);
  ASSERT_EQ(sequence_level.update_losses.size(), 2u);
  EXPECT_EQ(sequence_level.update_losses[0], token_level.update_losses[0]);
  EXPECT_EQ(sequence_level.update_grad_norms[0], token_level.update_grad_norms[0]);
  EXPECT_NE(sequence_level.update_losses[1], token_level.update_losses[1]);
  std::vector<std::string> common = sample_mean;
  common.push_back("grpo.ratio_level=sequence");
  common.push_back("grpo.tis_cap=1.5");
  const float generation_logp = -5.05f;
  const std::vector<LearnerStep> reference = learn("gspo-one", common, 2, 5, generation_logp);
  ASSERT_EQ(reference.size(), 2u);
  EXPECT_GT(reference[0].truncated_fraction, 0.0);
  EXPECT_LT(reference[0].truncated_fraction, 1.0);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2", "parallel.zero=3"},
      {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},
      {"runtime.ranks=2", "parallel.cp=2"},
      {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=a2a"},
      {"runtime.ranks=4", "parallel.cp=2"},
  };
  expect_updates_in_layouts("gspo-layout", common, layouts, "gspo-one", reference, generation_logp);
}

// grpo.importance_correction seq_mask_tis, its band [0.9, 1.1] keeping about half the samples
// (the rollouts' generation log-probabilities around the model's, as in the GSPO test), with two
// updates a step: each sample's mean weight summed over its chunks at cp 2, and dp 2 with ZeRO-3,
// pp 2 and cp 2 (ring and all-to-all) equal one rank.
TEST_F(GrpoLearnerTest, SeqMaskTisMasksWholeSamplesInEveryLayoutAsOneRank) {
  const std::vector<std::string> common = {"optim.eps=1e-4", "grpo.minibatches=2",
                                           "grpo.importance_correction=seq_mask_tis", "grpo.seq_mask_low=0.9",
                                           "grpo.seq_mask_high=1.1"};
  const float generation_logp = -5.05f;
  const std::vector<LearnerStep> reference = learn("seqmask-one", common, 2, 5, generation_logp);
  ASSERT_EQ(reference.size(), 2u);
  EXPECT_GT(reference[0].masked_fraction, 0.1);
  EXPECT_LT(reference[0].masked_fraction, 0.9);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2", "parallel.zero=3"},
      {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"},
      {"runtime.ranks=2", "parallel.cp=2"},
      {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=a2a"},
  };
  expect_updates_in_layouts("seqmask-layout", common, layouts, "seqmask-one", reference, generation_logp);
}

// The start-up report says how a step's rows are laid out, with the unit a packed step's rows
// are a multiple of (train.micro_batch x data-parallel ranks), and how many updates a step takes.
TEST_F(GrpoLearnerTest, ItSaysHowItLaysOutItsRows) {
  for (const bool packing : {true, false}) {
    const std::string layout = packing ? "grpo.packing=true" : "grpo.packing=false";
    const config::RunConfig c = config(packing ? "say-packed" : "say-padded", {"runtime.ranks=2", layout});
    std::ostringstream out;
    train::run_on_ranks(c, out, [&](comm::Communicator& world) {
      GrpoLearner learner(c, world, out);
      learner.finish();
      return train::TrainSummary{};
    });
    const std::string expected =
        packing ? "grpo: each step's samples packed into rows of 16 tokens (first-fit decreasing); a step trains on "
                  "the rows they fill, a multiple of 8, at most 16 (train.global_batch)"
                : "grpo: one sample per row of 16 tokens, 16 rows a step (grpo.packing false)";
    EXPECT_NE(out.str().find(expected), std::string::npos) << out.str();
  }
  const config::RunConfig c = config("say-minibatches", {"grpo.minibatches=2", "grpo.epochs=3"});
  std::ostringstream out;
  train::run_on_ranks(c, out, [&](comm::Communicator& world) {
    GrpoLearner learner(c, world, out);
    learner.finish();
    return train::TrainSummary{};
  });
  for (const std::string expected :
       {"grpo: 6 optimizer updates a step (grpo.minibatches 2, each on its share of the samples, in order; "
        "grpo.epochs 3 passes over them), the later ones' ratios to the policy the step started from",
        "grpo: an update's samples packed into rows of 16 tokens (first-fit decreasing); an update trains on the rows "
        "they fill, a multiple of 4, at most 16 (train.global_batch)"}) {
    EXPECT_NE(out.str().find(expected), std::string::npos) << out.str();
  }
}

TEST_F(GrpoLearnerTest, RefusesWhatItCannotTrain) {
  auto fails = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const config::RunConfig c = config("refuse", {});
  std::ostringstream out;
  train::run_on_ranks(c, out, [&](comm::Communicator& world) {
    GrpoLearner learner(c, world, out);
    std::vector<RolloutGroup> groups = make_groups(7);
    groups[1].samples[2].tokens.resize(30, 1);
    groups[1].samples[2].trained.resize(30, 1);
    groups[1].samples[2].generation_logprobs.resize(30, -1.0f);
    fails([&] { learner.step(groups); }, "rollout group 1 sample 2 has 30 tokens");
    groups = make_groups(7);
    groups[0].samples[0].trained.pop_back();
    fails([&] { learner.step(groups); }, "trained marks");
    groups = make_groups(7);
    groups.push_back(groups[0]);
    fails([&] { learner.step(groups); }, "train.global_batch");
    learner.finish();
    return train::TrainSummary{};
  });
  const std::vector<std::vector<std::string>> ramps = {
      {"train.rampup_batch_size=[4, 4, 100]"}, {"train.samples=64", "train.steps=0", "optim.warmup_steps=0"}};
  for (const std::vector<std::string>& overrides : ramps) {
    const config::RunConfig ramp = config("refuse-ramp", overrides);
    fails([&] {
      train::run_on_ranks(ramp, out, [&](comm::Communicator& world) {
        GrpoLearner learner(ramp, world, out);
        return train::TrainSummary{};
      });
    }, "train.rampup_batch_size and train.samples are for pre-training and fine-tuning");
  }
}

}  // namespace
}  // namespace loom::rl
