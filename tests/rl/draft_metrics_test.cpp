// The controller's view of the generation workers' speculative decoding (grpo.
// worker_speculative_tokens): counters read from each worker's Prometheus /metrics, summed over
// workers as what grew since the previous row; a worker restarted since (its counters lower)
// counts from 0, one that does not answer or answers something else is left out; rates are null
// with nothing drafted.
#include "loom/rl/controller/draft_metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <mutex>

#include "loom/core/error.h"
#include "rl_test_support.h"

namespace loom::rl {
namespace {

// A worker's /metrics in `loom serve`'s format (serve/server.cpp) with these counters.
std::string worker_metrics(int drafts, int drafted, int accepted, std::vector<int> at) {
  std::string text = "# HELP loom_generation_tokens_total Tokens generated.\n"
                     "# TYPE loom_generation_tokens_total counter\nloom_generation_tokens_total 500\n";
  text += "loom_spec_decode_drafts_total " + std::to_string(drafts) + "\n";
  text += "loom_spec_decode_draft_tokens_total " + std::to_string(drafted) + "\n";
  text += "loom_spec_decode_accepted_tokens_total " + std::to_string(accepted) + "\n";
  for (size_t j = 0; j < at.size(); ++j) {
    text += "loom_spec_decode_accepted_tokens_per_position_total{position=\"" + std::to_string(j) + "\"} " +
            std::to_string(at[j]) + "\n";
  }
  return text + "loom_time_to_first_token_seconds_count 7\n";
}

// A fake worker answering /metrics with whatever `text` holds now.
struct FakeWorker {
  FakeWorker()
      : thread([this](const std::function<void(int)>& on) {
                 server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
                   std::lock_guard<std::mutex> lock(mutex);
                   res.set_content(text, "text/plain");
                 });
                 const int port = server.bind_to_any_port("127.0.0.1");
                 on(port);
                 server.listen_after_bind();
               },
               [this] { server.stop(); }) {}
  void answer(const std::string& t) {
    std::lock_guard<std::mutex> lock(mutex);
    text = t;
  }
  httplib::Server server;
  std::mutex mutex;
  std::string text;
  testing::ServingThread thread;
};

TEST(DraftMetrics, ParsesAWorkersCounters) {
  const DraftCounters c = parse_draft_counters(worker_metrics(10, 20, 15, {9, 6}));
  EXPECT_EQ(c.drafts, 10);
  EXPECT_EQ(c.draft_tokens, 20);
  EXPECT_EQ(c.accepted_tokens, 15);
  EXPECT_EQ(c.accepted_at, (std::vector<double>{9, 6}));
  EXPECT_EQ(parse_draft_counters("loom_generation_tokens_total 3\n").draft_tokens, 0);  // a worker without drafts
  EXPECT_THROW(parse_draft_counters("loom_spec_decode_drafts_total many\n"), Error);
}

TEST(DraftMetrics, SumsWhatGrewOverWorkersSinceTheLastRow) {
  FakeWorker a, b;
  a.answer(worker_metrics(10, 20, 15, {9, 6}));
  b.answer(worker_metrics(4, 8, 2, {2, 0}));
  DraftMetrics metrics;
  nlohmann::json row = metrics.since_last({a.thread.url(), b.thread.url()}, 5.0);
  EXPECT_EQ(row["drafts"], 14);
  EXPECT_EQ(row["draft_tokens"], 28);
  EXPECT_EQ(row["accepted_tokens"], 17);
  EXPECT_DOUBLE_EQ(row["acceptance_rate"].get<double>(), 17.0 / 28.0);
  EXPECT_DOUBLE_EQ(row["mean_acceptance_length"].get<double>(), 1.0 + 17.0 / 14.0);
  EXPECT_DOUBLE_EQ(row["acceptance_rate_per_position"][1].get<double>(), 6.0 / 14.0);
  // Next row: a grew; b restarted (its counters start again from 0) and drafted 3 since.
  a.answer(worker_metrics(16, 32, 27, {14, 13}));
  b.answer(worker_metrics(3, 6, 6, {3, 3}));
  row = metrics.since_last({a.thread.url(), b.thread.url()}, 5.0);
  EXPECT_EQ(row["drafts"], 6 + 3);
  EXPECT_EQ(row["draft_tokens"], 12 + 6);
  EXPECT_EQ(row["accepted_tokens"], 12 + 6);
  EXPECT_DOUBLE_EQ(row["acceptance_rate_per_position"][0].get<double>(), (5.0 + 3.0) / 9.0);
  // Nothing drafted since: null rates. A worker that is gone, or answers other text, is left out.
  b.answer("<html>not a worker</html>\nloom_spec_decode_drafts_total ?\n");
  row = metrics.since_last({a.thread.url(), b.thread.url(), "http://127.0.0.1:1"}, 2.0);
  EXPECT_EQ(row["draft_tokens"], 0);
  EXPECT_TRUE(row["acceptance_rate"].is_null());
  EXPECT_TRUE(row["mean_acceptance_length"].is_null());
  EXPECT_TRUE(row["acceptance_rate_per_position"].empty());
}

}  // namespace
}  // namespace loom::rl
