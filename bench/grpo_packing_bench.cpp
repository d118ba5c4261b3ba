// The GRPO learner's step with its samples packed into rows (grpo.packing, first-fit decreasing)
// against one sample per row, on the same rollout groups: samples of a P-token prompt and a
// response whose length is drawn from an exponential distribution of mean R tokens, capped so a
// sample fills at most data.seq_len + 1 tokens (reasoning rollouts: most answers short, a few
// long ones setting the row length). Prints, per layout, the rows a step trains on, the share of
// their slots holding tokens, the median learner step (LearnerStep::seconds) and the trained
// tokens per second, then packed over padded. The two runs' losses agree to fp32 rounding
// (tests/rl/grpo_learner_test.cpp); the first step's are printed.
// With --minibatches M (> 1) it compares instead packed steps of one optimizer update against
// packed steps of M (grpo.minibatches: each update on its share of the samples, packed alone,
// after M - 1 forward-only passes for the starting policy's log-probabilities); their first
// updates differ in samples, so only the rows and times compare.
//   loom_bench_grpo_packing CONFIG.yaml [section.key=value ...] [--steps N] [--warmup W]
//                           [--prompt P] [--response R] [--rounds K] [--minibatches M]
// Each layout runs K times, alternated (the first, the second, the first, ...); each run builds its
// learner from the config's seed, so every run trains the same steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "bench_config.h"
#include "loom/core/blas_cpu.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/rl/grpo_learner.h"
#include "loom/train/run_ranks.h"

namespace {

using namespace loom;

// Step `step`'s groups: prompts_per_step groups of samples_per_prompt samples, random tokens,
// trained after the prompt with generation log-probabilities near -5.5, rewards 0 or 1.
std::vector<rl::RolloutGroup> groups_for(const config::RunConfig& c, int64_t step, int prompt, int response) {
  std::vector<rl::RolloutGroup> groups;
  const int most = c.data.seq_len + 1 - prompt;
  const uint64_t seed = 1000 + static_cast<uint64_t>(step);
  for (int g = 0; g < c.grpo.prompts_per_step; ++g) {
    rl::RolloutGroup group;
    group.prompt_index = g;
    for (int s = 0; s < c.grpo.samples_per_prompt; ++s) {
      const uint64_t sample = static_cast<uint64_t>(g * c.grpo.samples_per_prompt + s);
      const double uniform = (static_cast<double>(philox4x32(seed, sample, 0)[0]) + 0.5) / 4294967296.0;
      const int length = std::clamp(static_cast<int>(std::ceil(-std::log(uniform) * response)), 1, most);
      rl::Rollout r;
      for (int k = 0; k < prompt + length; ++k) {
        const auto bits = philox4x32(seed, sample, static_cast<uint64_t>(k) + 1);
        r.tokens.push_back(static_cast<int32_t>(bits[0] % 256));
        r.trained.push_back(k >= prompt ? 1 : 0);
        r.generation_logprobs.push_back(k >= prompt ? -5.0f - static_cast<float>(bits[1] % 1000) / 1000.0f : 0.0f);
      }
      r.reward = static_cast<double>(philox4x32(seed, sample, 0)[1] % 2);
      group.samples.push_back(r);
    }
    groups.push_back(group);
  }
  return groups;
}

struct Run {
  std::vector<rl::LearnerStep> steps;
};

Run learn(const config::RunConfig& c, int steps, int prompt, int response) {
  std::ostringstream quiet;
  Run run;
  std::mutex mutex;
  train::run_on_ranks(c, quiet, [&](comm::Communicator& world) {
    rl::GrpoLearner learner(c, world, quiet);
    std::vector<rl::LearnerStep> mine;
    for (int64_t s = 0; s < steps; ++s) mine.push_back(learner.step(groups_for(c, s, prompt, response)));
    learner.finish();
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      run.steps = mine;
    }
    return train::TrainSummary{};
  });
  return run;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  ensure_openblas_coretype(argv);
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s CONFIG.yaml [section.key=value ...] [--steps N] [--warmup W] [--prompt P] "
                 "[--response R] [--rounds K] [--minibatches M]\n",
                 argv[0]);
    return 2;
  }
  try {
    std::map<std::string, int> flags = {{"steps", 6},  {"warmup", 1}, {"prompt", 64},
                                        {"response", 96}, {"rounds", 2}, {"minibatches", 1}};
    config::RunConfig config = bench::load_bench_config(argc, argv, flags);
    const int steps = flags["steps"], warmup = flags["warmup"], prompt = flags["prompt"];
    const int response = flags["response"], rounds = flags["rounds"], minibatches = flags["minibatches"];
    LOOM_CHECK(steps > warmup && warmup >= 0 && rounds >= 1 && prompt >= 1 && prompt < config.data.seq_len &&
                   minibatches >= 1,
               "want --steps > --warmup >= 0, --rounds >= 1, 1 <= --prompt < data.seq_len and --minibatches >= 1");
    // The two layouts compared: {name, grpo.packing, grpo.minibatches}.
    struct Layout {
      std::string name;
      bool packing;
      int minibatches;
    };
    const std::vector<Layout> layouts =
        minibatches == 1 ? std::vector<Layout>{{"one per row", false, 1}, {"packed", true, 1}}
                         : std::vector<Layout>{{"one update", true, 1},
                                               {std::to_string(minibatches) + " updates", true, minibatches}};
    config.train.steps = steps;
    const std::string root =
        (std::filesystem::temp_directory_path() / ("loom-bench-grpo-packing-" + std::to_string(::getpid()))).string();
    std::printf("GRPO learner, %d prompts x %d samples, prompt %d tokens, responses exponential of mean %d "
                "(capped at %d), rows of %d, train.global_batch %d, micro_batch %d, %d ranks; median of steps "
                "%d-%d\n",
                config.grpo.prompts_per_step, config.grpo.samples_per_prompt, prompt, response,
                config.data.seq_len + 1 - prompt, config.data.seq_len, config.train.global_batch,
                config.train.micro_batch, config.runtime.ranks, warmup + 1, steps);
    std::printf("| layout | round | rows | slots holding tokens | step s (median) | trained tokens/s | first loss |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
    std::vector<std::vector<double>> medians(layouts.size());
    for (int round = 1; round <= rounds; ++round) {
      for (size_t l = 0; l < layouts.size(); ++l) {
        config.grpo.packing = layouts[l].packing;
        config.grpo.minibatches = layouts[l].minibatches;
        config.run.dir = root + "/layout" + std::to_string(l) + "-" + std::to_string(round);
        const Run run = learn(config, steps, prompt, response);
        std::vector<double> seconds;
        double rows = 0, efficiency = 0, tokens = 0;
        for (int s = warmup; s < steps; ++s) {
          const rl::LearnerStep& m = run.steps[static_cast<size_t>(s)];
          seconds.push_back(m.seconds);
          rows += static_cast<double>(m.rows) / (steps - warmup);
          efficiency += m.packing_efficiency / (steps - warmup);
          tokens += static_cast<double>(m.trained_tokens) / (steps - warmup);
        }
        const double step_s = median(seconds);
        medians[l].push_back(step_s);
        std::printf("| %s | %d | %.1f | %.1f%% | %.3f | %.0f | %.6f |\n", layouts[l].name.c_str(), round, rows,
                    100.0 * efficiency, step_s, tokens / step_s, run.steps.front().loss);
        std::fflush(stdout);
      }
    }
    std::filesystem::remove_all(root);
    std::printf("%s / %s, step time by round:", layouts[1].name.c_str(), layouts[0].name.c_str());
    for (size_t r = 0; r < static_cast<size_t>(rounds); ++r) std::printf(" %.3f", medians[1][r] / medians[0][r]);
    std::printf(" (%s: %.2fx the speed of %s over the rounds' medians)\n", layouts[1].name.c_str(),
                median(medians[0]) / median(medians[1]), layouts[0].name.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
