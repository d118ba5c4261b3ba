#pragma once
// Speculative decoding on the generation workers (grpo.worker_speculative_tokens): the drafts
// verified and kept since the previous metrics row, read from each worker's /metrics counters
// (loom_spec_decode_*_total, vLLM's spec_decode_num_*). The acceptance rate is what the depths'
// draft loss (grpo.mtp_loss_weight) keeps up as the policy moves; it sets how much faster the
// workers generate (docs/grpo.md, "Metrics").
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::rl {

// One worker's speculative decoding counters.
struct DraftCounters {
  double drafts = 0.0;          // verifications of a sample's drafts
  double draft_tokens = 0.0;    // drafted tokens verified
  double accepted_tokens = 0.0;  // of them kept
  std::vector<double> accepted_at;  // kept, by place among a verification's drafts
};

// The counters in a worker's Prometheus text (zeros where a counter is absent). Throws
// loom::Error naming the line where a counter's value is not a number.
DraftCounters parse_draft_counters(const std::string& metrics_text);

class DraftMetrics {
 public:
  // The row's `spec_decode` object over `worker_urls` since the previous call: drafts,
  // draft_tokens, accepted_tokens, acceptance_rate (accepted / drafted), mean_acceptance_length
  // (tokens a verification gives: 1 + accepted / drafts) and acceptance_rate_per_position
  // (kept at place j / drafts); rates are null with nothing drafted. A counter lower than last
  // read is a worker restarted since (counting again from 0); a worker that does not answer in
  // `timeout_s` is left out of this row and read again the next.
  nlohmann::json since_last(const std::vector<std::string>& worker_urls, double timeout_s);

 private:
  std::map<std::string, DraftCounters> last_;  // by worker url
};

}  // namespace loom::rl
