#pragma once
// What a GRPO rollout is, as the generation side hands it to the learners: the token ids and the
// generation log-probabilities exactly as the inference server returned them (never re-tokenised),
// the environment's reward, and the weight version that sampled it. A group is the n samples of
// one prompt; its advantages are relative to each other (rl/grpo_loss.h).
#include <cstdint>
#include <string>
#include <vector>

namespace loom::rl {

struct Rollout {
  // The whole episode as one token sequence: prompt, then model turns and (multi-turn) tool
  // results. `trained[i]` is 1 for tokens the model sampled (a loss is taken on them), 0 for
  // prompt and tool-result tokens. `generation_logprobs[i]` is the server's log-probability of
  // token i (0 where trained[i] is 0).
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;
  std::vector<float> generation_logprobs;
  double reward = 0.0;
  bool truncated = false;          // stopped by max_tokens / the step limit, not by the model
  std::string environment;         // e.g. "countdown"
};

struct RolloutGroup {
  int64_t prompt_index = 0;        // which task of the environment's prompt set
  int64_t weight_version = 0;      // the learner step whose weights sampled every member
  std::vector<Rollout> samples;    // grpo.samples_per_prompt of them
};

// Every sample of the group got the same reward: its advantages are all zero, it teaches nothing
// (grpo.dynamic_sampling drops such groups).
inline bool rewarded_alike(const RolloutGroup& group) {
  for (const Rollout& s : group.samples)
    if (s.reward != group.samples.front().reward) return false;
  return true;
}

}  // namespace loom::rl
