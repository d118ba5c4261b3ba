#include "loom/ops/heartbeat_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "loom/comm/activity.h"
#include "loom/ops/heartbeat.h"

namespace loom::ops {

namespace {

constexpr auto kInterval = std::chrono::milliseconds(500);

double to_seconds(comm::activity::WallClock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// One per process: the ranks living here and the thread that writes their files.
class Writer {
 public:
  static Writer& instance() {
    static Writer* writer = new Writer();  // never destroyed: rank threads may outlive statics
    return *writer;
  }

  // `dir` and `attempt` (from the environment) take effect when no rank is registered.
  void add(int rank, int world_size, const std::string& dir, int attempt) {
    comm::activity::enable();
    std::unique_lock lock(mutex_);
    if (ranks_.empty()) {
      dir_ = dir;
      attempt_ = attempt;
      std::error_code ec;
      std::filesystem::create_directories(dir_, ec);
    }
    State& s = ranks_[rank];
    s = State{};
    s.world_size = world_size;
    s.progress_time = wall_seconds();
    write_locked(rank, s);
    if (!thread_.joinable()) thread_ = std::thread([this, generation = generation_] { loop(generation); });
  }

  void update(int rank, std::string_view phase, int64_t step, bool finished, bool write_now) {
    std::lock_guard lock(mutex_);
    auto it = ranks_.find(rank);
    if (it == ranks_.end()) return;
    State& s = it->second;
    if (s.phase != phase || s.step != step || s.finished != finished) {
      s.phase = phase;
      s.step = step;
      s.finished = finished;
      s.progress_time = wall_seconds();
      // Every change reaches the file at once: a rank killed right after it (SIGKILL, a node
      // lost) leaves its latest step and phase behind, not the state of up to kInterval ago.
      // A few writes per step at most; the loop below only refreshes `time` between changes.
      write_now = true;
    }
    if (write_now) write_locked(rank, s);
  }

  void remove(int rank) {
    std::thread finished_thread;
    {
      std::lock_guard lock(mutex_);
      auto it = ranks_.find(rank);
      if (it == ranks_.end()) return;
      write_locked(rank, it->second);
      ranks_.erase(it);
      if (ranks_.empty() && thread_.joinable()) {
        ++generation_;  // stops that thread (a later add starts a new one)
        finished_thread = std::move(thread_);
      }
    }
    cv_.notify_all();
    if (finished_thread.joinable()) finished_thread.join();
  }

 private:
  struct State {
    int world_size = 1;
    std::string phase = "setup";
    int64_t step = 0;
    bool finished = false;
    double progress_time = 0.0;
    bool warned = false;
  };

  Writer() : host_(host_name()) {}

  void loop(uint64_t generation) {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait_for(lock, kInterval, [&] { return generation_ != generation; });
      if (generation_ != generation) break;
      for (auto& [rank, state] : ranks_) write_locked(rank, state);
    }
  }

  void write_locked(int rank, State& s) {
    HeartbeatRecord r;
    r.rank = rank;
    r.world_size = s.world_size;
    r.pid = ::getpid();
    r.host = host_;
    r.attempt = attempt_;
    r.step = s.step;
    r.phase = s.phase;
    r.finished = s.finished;
    r.time = wall_seconds();
    r.progress_time = s.progress_time;
    const comm::activity::RankActivity activity = comm::activity::snapshot(rank);
    if (activity.changes > 0) r.progress_time = std::max(r.progress_time, to_seconds(activity.last_change));
    if (!activity.waiting.empty()) {
      const comm::activity::Operation& op = activity.waiting.front();
      r.collective = HeartbeatCollective{op.op, op.group, op.seq, to_seconds(op.since)};
    }
    try {
      write_heartbeat(dir_, r);
    } catch (const std::exception& e) {
      if (!s.warned) std::cerr << "loom: warning: " << e.what() << " (heartbeats of rank " << rank << " stop)\n";
      s.warned = true;
    }
  }

  std::string dir_;
  int attempt_ = 0;
  std::string host_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int, State> ranks_;
  std::thread thread_;
  uint64_t generation_ = 0;
};

}  // namespace

Heartbeat::Heartbeat(int world_rank, int world_size) : rank_(world_rank) {
  const char* dir = std::getenv(kHeartbeatDirEnv);
  if (dir == nullptr || *dir == '\0') return;
  const char* attempt = std::getenv(kRestartCountEnv);
  Writer::instance().add(world_rank, world_size, dir, attempt != nullptr ? std::atoi(attempt) : 0);
  active_ = true;
}

Heartbeat::~Heartbeat() {
  if (active_) Writer::instance().remove(rank_);
}

void Heartbeat::phase(std::string_view phase, int64_t step) {
  if (active_) Writer::instance().update(rank_, phase, step, false, false);
}

void Heartbeat::done(bool finished, int64_t step) {
  if (active_) Writer::instance().update(rank_, "done", step, finished, true);
}

}  // namespace loom::ops
