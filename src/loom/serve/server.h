#pragma once
// `loom serve`: an OpenAI-compatible HTTP server (cpp-httplib) in front of one inference
// engine. Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /tokenize,
// /detokenize, /health, /metrics, /load_weights (docs/serving.md). The engine runs on its own
// thread; HTTP handlers submit requests and relay their outputs (server-sent events when
// streaming). A bounded queue answers 429 beyond it; a client that goes away has its request
// cancelled (its KV blocks freed); shutdown() finishes running requests first. With a profile
// directory, /start_profile and /stop_profile record the engine's steps between them
// (ops/window_trace.h) and start and stop the device's profiler.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "loom/infer/engine.h"
#include "loom/ops/window_trace.h"

namespace httplib {
class Server;
}

namespace loom::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;           // 0: any free port
  int64_t max_queue = 256;   // requests waiting for the engine before 429
  std::string model_name = "loom";
  int http_threads = 64;
  std::string profile_dir;   // POST /start_profile and /stop_profile write traces here; empty: off
};

class Server {
 public:
  Server(infer::Engine& engine, ServeOptions options);
  ~Server();
  // Binds and serves until shutdown(); calls `on_listening(port)` once bound.
  void run(const std::function<void(int port)>& on_listening = {});
  // Stops taking requests (503), lets the engine finish what it holds, then stops the server.
  // Safe from any thread (not from a signal handler: set a flag and call it from a thread).
  void shutdown();

 private:
  void routes();
  void handle_generate(const std::string& body, bool chat, void* response);
  void profile_routes();
  std::string metrics_text() const;

  infer::Engine& engine_;
  ServeOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread engine_thread_;
  std::unique_ptr<ops::WindowTrace> profile_;  // the engine thread's sink when profiling is on
  std::atomic<bool> closing_{false};
  std::atomic<int64_t> active_handlers_{0}, rejected_{0}, bad_requests_{0};
};

}  // namespace loom::serve
