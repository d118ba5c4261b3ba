#pragma once
// The agent loop: one GRPO group for one prompt of an environment. Seeds a session per sample
// (POST /seed_session), runs model turns through a generation worker's OpenAI chat endpoint
// (return_token_ids, logprobs), executes the tool calls the model writes
// (<tool_call>{"name", "arguments"}</tool_call>) against the environment (POST /<tool>) until
// the model answers without one or max_turns is reached, then scores each sample
// (POST /verify). Token ids and log-probabilities are the server's, never re-tokenised: each
// turn's prompt_token_ids must extend the episode so far (checked), the new part is appended
// untrained, the sampled token_ids trained. A single-turn environment asks for all n samples in
// one request (the server's `n`).
#include <cstdint>
#include <string>

#include "loom/core/error.h"
#include "loom/rl/rollout.h"

namespace loom::rl {

struct AgentOptions {
  std::string model_url;        // a `loom serve` worker, http://host:port
  std::string environment_url;  // a `loom env serve`, http://host:port
  std::string environment_name;  // the samples' environment in metrics; empty: the name the server reports
  std::string environment_task;  // the task the server must report serving (an Error otherwise); empty: any
  std::string model_name = "loom";
  int samples = 4;              // the group size n
  int max_turns = 1;            // model turns per episode (1: single-turn)
  int64_t max_tokens = 64;      // per model turn
  double temperature = 1.0;
  double top_p = 1.0;
  uint64_t seed = 0;            // sampling seed of the group's requests
  double generation_timeout_s = 300.0;
  double environment_timeout_s = 30.0;
};

struct GroupStats {
  int64_t generated_tokens = 0;  // sampled by the model
  int64_t tool_calls = 0;
  double seconds = 0.0;
};

// Which failed: the environment or the generation worker (the controller restarts that role).
enum class FailedRole { Environment, Generation };

// An episode that could not be completed: a role was unreachable, timed out, or answered an error.
class EpisodeFailure : public Error {
 public:
  EpisodeFailure(FailedRole role, const std::string& message) : Error(message), role(role) {}
  FailedRole role;
};

// Runs the group; throws EpisodeFailure when a role fails. weight_version is the oldest version
// that sampled any of its tokens (parsed from the server's "step-N" weight_version).
RolloutGroup run_group(const AgentOptions& options, int64_t prompt_index, GroupStats* stats = nullptr);

// "step-12" (or "12") -> 12; anything else is an Error naming the value.
int64_t parse_weight_version(const std::string& version);

}  // namespace loom::rl
