#pragma once
// What a caller asks of the engine and what it gets back: per-request sampling options, and a
// thread-safe stream of per-step outputs the engine pushes and a server (or test) pops.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/infer/logprobs.h"
#include "loom/infer/penalties.h"
#include "loom/infer/sampling.h"

namespace loom::infer {

struct RequestOptions {
  model::SamplingParams sampling;         // temperature, top_k, top_p, min_p
  std::optional<uint64_t> seed;           // none: drawn from the engine's request counter
  int64_t max_tokens = 16;
  int n = 1;                              // samples of the prompt (they share its KV blocks)
  std::vector<std::string> stop;          // stop strings (left out of the text)
  std::vector<int32_t> stop_token_ids;    // besides the tokenizer's end of text
  bool ignore_eos = false;
  int top_logprobs = 0;                   // most likely alternatives reported per token
  Penalties penalties;                    // presence, frequency (OpenAI) and repetition (vLLM) penalties
};

// New output of one sample since the previous event.
struct SampleEvent {
  int index = 0;                          // which of the n samples
  std::vector<int32_t> tokens;            // newly sampled ids (a stop token included)
  std::vector<TokenLogprobs> logprobs;    // one per token
  std::string text;                       // newly final text
  std::string finish_reason;              // empty while running; stop | length | abort
};

class RequestStream {
 public:
  RequestStream(int64_t id, std::vector<int32_t> prompt, int n) : id_(id), prompt_(std::move(prompt)), n_(n) {}
  int64_t id() const { return id_; }
  const std::vector<int32_t>& prompt() const { return prompt_; }
  int n() const { return n_; }

  // Engine side.
  void push(SampleEvent event);
  void fail(const std::string& message);  // ends the request with an error
  void set_weight_version(const std::string& version);

  // Caller side: waits up to `timeout` for events; returns them (empty on timeout). done() is
  // true once every sample has finished (or the request failed) and all events were popped.
  std::vector<SampleEvent> pop(std::chrono::milliseconds timeout);
  bool done() const;
  std::string error() const;
  std::string weight_version() const;
  // Asks the engine to stop this request (client gone): its samples end with "abort".
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  int64_t id_;
  std::vector<int32_t> prompt_;
  int n_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<SampleEvent> events_;
  int finished_ = 0;
  std::string error_, weight_version_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace loom::infer
