#pragma once
// An environment as an HTTP service (cpp-httplib), in NeMo Gym's shape (docs/grpo.md):
//   POST /seed_session {"index": I}             -> {"session_id", "messages", "tools", "environment"}
//   POST /verify {"session_id", "response" | "messages"} -> {"reward", "components"}
//   POST /<tool> {arguments...}                 -> the tool's result (calculator: {"result"})
//   GET  /health                                -> {"status": "ok", "environment"}
// Bad requests are 4xx JSON errors ({"error": {"message", "param", ...}}) naming the field.
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "loom/rl/env/environment.h"

namespace httplib {
class Server;
}

namespace loom::rl {

class EnvironmentServer {
 public:
  EnvironmentServer(std::unique_ptr<Environment> environment, std::string host, int port);
  ~EnvironmentServer();
  // Binds (port 0: any free one), calls `on_listening(port)`, serves until stop().
  void run(const std::function<void(int port)>& on_listening = {});
  void stop();

 private:
  void routes();

  std::unique_ptr<Environment> environment_;
  std::string host_;
  int port_;
  std::unique_ptr<httplib::Server> http_;
  std::mutex mutex_;  // guards sessions_, next_session_
  std::map<int64_t, Episode> sessions_;
  int64_t next_session_ = 1;
};

}  // namespace loom::rl
