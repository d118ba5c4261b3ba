#pragma once
// OpenAI's presence and frequency penalties and vLLM's repetition penalty on a row of logits, as
// vLLM applies them before temperature and truncation: for a token t that the sample's output
// holds c_t times (its prompt not counted),
//   logit_t -= frequency_penalty c_t + presence_penalty [c_t > 0]
// after the repetition penalty r, which divides a positive logit by r and multiplies a negative one
// by r for every token the prompt or the output holds. The log-probabilities a request reports stay
// the model's own (vLLM's raw log-probabilities).
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace loom::infer {

struct Penalties {
  double presence = 0.0, frequency = 0.0;  // in [-2, 2]
  double repetition = 1.0;                 // > 0; 1: none
  bool active() const { return presence != 0.0 || frequency != 0.0 || repetition != 1.0; }
};

// The tokens a sample's penalties read: how often each appears in its output, and (for the
// repetition penalty) which the prompt holds.
struct PenaltyCounts {
  std::unordered_map<int32_t, int32_t> output;
  std::vector<int32_t> prompt;  // distinct ids, sorted
  // What `penalties` read of a sample with prompt `ids` (the prompt's ids only for a repetition
  // penalty; nothing at all without penalties).
  PenaltyCounts(const Penalties& penalties, const std::vector<int32_t>& ids);
  PenaltyCounts() = default;
  void add_output(int32_t token) { ++output[token]; }
};

// `logits` ([vocab]) with `penalties` applied into `out` (which may be `logits`).
void apply_penalties(const float* logits, int64_t vocab, const Penalties& penalties, const PenaltyCounts& counts,
                     float* out);
// The row a sample draws from: `logits` itself when `penalties` are none, else them applied into
// `scratch`.
const float* penalized_row(const float* logits, int64_t vocab, const Penalties& penalties, const PenaltyCounts& counts,
                           std::vector<float>& scratch);

}  // namespace loom::infer
