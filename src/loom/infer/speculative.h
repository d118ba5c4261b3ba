#pragma once
// Speculative decoding's verification (Leviathan et al. 2023, Chen et al. 2023): a draft token d
// proposed from distribution q is kept with probability min(1, p(d) / q(d)) under the target's
// distribution p; at the first one refused the next token is drawn from the residual
// max(0, p - q), normalised. Every token so emitted is distributed as p alone would draw it. Under
// greedy sampling (both distributions one id) a draft is kept when it is the target's argmax and
// the token emitted in its place is that argmax: the output is the target's greedy output.
#include <cstdint>
#include <string>

#include "loom/infer/sampling.h"

namespace loom::infer {

// The Philox streams of a request's key (sampling.h) that draw its drafts and their acceptance;
// the tokens emitted are drawn from stream 0 as without drafts.
constexpr uint64_t kDraftStream = 1;
constexpr uint64_t kAcceptStream = 2;

// Whether `draft`, drawn from `draft_distribution`, is kept under `target`, for u uniform in [0, 1).
bool accept_draft(const model::TokenDistribution& target, const model::TokenDistribution& draft_distribution,
                  int32_t draft, double u);
// The token in place of a refused draft: drawn from max(0, target - draft) normalised, for u
// uniform in [0, 1) (from the target where the two are equal and nothing is left).
int32_t residual_token(const model::TokenDistribution& target, const model::TokenDistribution& draft_distribution,
                       double u);

// The drafts per step that vLLM's --speculative-config JSON asks for, `{"method": "mtp",
// "num_speculative_tokens": N}` (N >= 1; the model's multi-token prediction depths draft them); an
// Error naming the key or value for anything else (other methods, unknown keys, bad JSON).
int parse_speculative_config(const std::string& json);

}  // namespace loom::infer
