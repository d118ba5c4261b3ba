#pragma once
// Which collective each rank of this process is blocked in right now, for heartbeats and hang
// diagnosis (see ops/heartbeat.h and docs/operations.md).
//
// The backends open an `activity::Scope` where a rank waits for its peers (threads: a rank that
// arrived at a collective before the others, in Group::arrive; mpi: a caller waiting for an
// operation, in Group::wait). Records are keyed by world rank, so the ranks of the threads
// backend (threads of one process) each have their own. Recording is off until `enable()`
// (the heartbeat writer turns it on): a disabled Scope costs one atomic load.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::comm::activity {

using WallClock = std::chrono::system_clock;

struct Operation {
  std::string op;     // "all_reduce", "barrier", "send", ...
  std::string group;  // "world", "dp-0", ...
  int64_t seq = 0;    // the operation's sequence number on its group (as in timeout errors)
  WallClock::time_point since;
};

struct RankActivity {
  std::vector<Operation> waiting;  // oldest first; usually zero or one
  uint64_t changes = 0;            // enters + leaves so far
  WallClock::time_point last_change{};  // epoch when never
};

void enable();
bool enabled();

// Marks `world_rank` as waiting in an operation for the scope's lifetime.
class Scope {
 public:
  Scope(int world_rank, std::string_view op, std::string_view group, int64_t seq);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int world_rank_ = -1;  // -1: not recording
  uint64_t id_ = 0;
};

// What `world_rank` is waiting in now (empty when nothing was recorded for it).
RankActivity snapshot(int world_rank);

}  // namespace loom::comm::activity
