#pragma once
// The engine's counters and latency histograms, read by a server's /metrics (Prometheus text).
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace loom::infer {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double value);
  // Prometheus exposition lines of `name` (buckets, sum, count).
  std::string prometheus(const std::string& name, const std::string& help) const;
  // The value below which `q` of the observations fall (bucket upper bound), 0 when empty.
  double quantile(double q) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct EngineMetrics {
  std::atomic<int64_t> requests{0}, requests_finished{0}, prompt_tokens{0}, generation_tokens{0};
  std::atomic<int64_t> cached_prompt_tokens{0}, steps{0};
  std::atomic<int64_t> kv_blocks_in_use{0}, kv_blocks_total{0};  // gauges, set by the engine thread
  // Mamba state pool of a hybrid model (0 otherwise): slots held, slots, bytes per rank.
  std::atomic<int64_t> state_slots_in_use{0}, state_slots_total{0}, state_pool_bytes{0};
  // Speculative decoding: verifications, tokens drafted and kept, and by draft position (from the
  // first) how often it was kept.
  std::atomic<int64_t> spec_verifications{0}, spec_draft_tokens{0}, spec_accepted_tokens{0};
  static constexpr int kMaxDraftPositions = 16;
  std::array<std::atomic<int64_t>, kMaxDraftPositions> spec_accepted_at{};
  void count_drafts(int64_t drafted, int64_t kept) {
    spec_verifications++;
    spec_draft_tokens += drafted;
    spec_accepted_tokens += kept;
    for (int64_t j = 0; j < kept && j < kMaxDraftPositions; ++j) spec_accepted_at[static_cast<size_t>(j)]++;
  }
  Histogram time_to_first_token{{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram inter_token_latency{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

}  // namespace loom::infer
