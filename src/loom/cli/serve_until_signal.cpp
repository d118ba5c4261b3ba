#include "loom/cli/serve_until_signal.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

namespace loom::cli {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int) { g_stop_signal = 1; }
}  // namespace

void serve_until_signal(const std::function<void()>& serve, const std::function<void()>& stop) {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::atomic<bool> served{false};
  std::thread watcher([&] {
    while (!served && g_stop_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop_signal != 0) stop();
  });
  try {
    serve();
  } catch (...) {
    served = true;
    watcher.join();
    throw;
  }
  served = true;
  watcher.join();
}

}  // namespace loom::cli
