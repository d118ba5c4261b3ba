#include "loom/rl/controller/draft_metrics.h"

#include <cstdlib>
#include <sstream>

#include "loom/core/error.h"
#include "loom/rl/http_json.h"

namespace loom::rl {

namespace {

double counter_value(const std::string& line, size_t value_start) {
  const char* begin = line.c_str() + value_start;
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  LOOM_CHECK(end != begin, "worker /metrics: no counter value in line '" + line + "'");
  return value;
}

// Whether a worker's counters went down since `before`: it restarted, counting from 0 again.
bool restarted(const DraftCounters& now, const DraftCounters& before) {
  if (now.drafts < before.drafts || now.draft_tokens < before.draft_tokens ||
      now.accepted_tokens < before.accepted_tokens || now.accepted_at.size() < before.accepted_at.size())
    return true;
  for (size_t j = 0; j < before.accepted_at.size(); ++j) {
    if (now.accepted_at[j] < before.accepted_at[j]) return true;
  }
  return false;
}

}  // namespace

DraftCounters parse_draft_counters(const std::string& metrics_text) {
  DraftCounters c;
  const std::string per_position = "loom_spec_decode_accepted_tokens_per_position_total{position=\"";
  const std::vector<std::pair<std::string, double*>> totals = {
      {"loom_spec_decode_drafts_total ", &c.drafts},
      {"loom_spec_decode_draft_tokens_total ", &c.draft_tokens},
      {"loom_spec_decode_accepted_tokens_total ", &c.accepted_tokens}};
  std::istringstream in(metrics_text);
  for (std::string line; std::getline(in, line);) {
    for (const auto& [name, value] : totals) {
      if (line.rfind(name, 0) == 0) *value = counter_value(line, name.size());
    }
    if (line.rfind(per_position, 0) != 0) continue;
    const size_t close = line.find("\"} ", per_position.size());
    LOOM_CHECK(close != std::string::npos, "worker /metrics: malformed line '" + line + "'");
    const int position = std::atoi(line.c_str() + per_position.size());
    LOOM_CHECK(position >= 0 && position < 64, "worker /metrics: position out of range in line '" + line + "'");
    if (c.accepted_at.size() <= static_cast<size_t>(position)) c.accepted_at.resize(static_cast<size_t>(position) + 1);
    c.accepted_at[static_cast<size_t>(position)] = counter_value(line, close + 3);
  }
  return c;
}

nlohmann::json DraftMetrics::since_last(const std::vector<std::string>& worker_urls, double timeout_s) {
  DraftCounters sum;
  for (const std::string& url : worker_urls) {
    DraftCounters now;
    try {
      now = parse_draft_counters(get_ok_text(url, "/metrics", timeout_s));
    } catch (const Error&) {  // down or restarting (HttpFailure), or not a worker's counters
      continue;               // read again for the next row
    }
    const DraftCounters before = restarted(now, last_[url]) ? DraftCounters{} : last_[url];
    sum.drafts += now.drafts - before.drafts;
    sum.draft_tokens += now.draft_tokens - before.draft_tokens;
    sum.accepted_tokens += now.accepted_tokens - before.accepted_tokens;
    if (sum.accepted_at.size() < now.accepted_at.size()) sum.accepted_at.resize(now.accepted_at.size());
    for (size_t j = 0; j < now.accepted_at.size(); ++j) {
      sum.accepted_at[j] += now.accepted_at[j] - (j < before.accepted_at.size() ? before.accepted_at[j] : 0.0);
    }
    last_[url] = now;
  }
  nlohmann::json out = {{"drafts", sum.drafts},
                        {"draft_tokens", sum.draft_tokens},
                        {"accepted_tokens", sum.accepted_tokens},
                        {"acceptance_rate", nullptr},
                        {"mean_acceptance_length", nullptr},
                        {"acceptance_rate_per_position", nlohmann::json::array()}};
  if (sum.draft_tokens > 0) out["acceptance_rate"] = sum.accepted_tokens / sum.draft_tokens;
  if (sum.drafts > 0) {
    out["mean_acceptance_length"] = 1.0 + sum.accepted_tokens / sum.drafts;
    for (double kept : sum.accepted_at) out["acceptance_rate_per_position"].push_back(kept / sum.drafts);
  }
  return out;
}

}  // namespace loom::rl
