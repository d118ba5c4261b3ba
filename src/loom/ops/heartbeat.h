#pragma once
// Heartbeats: how the ranks of a `loom train` tell a supervisor (`loom launch`, see
// supervisor.h) that they are alive and making progress, and the pure functions the supervisor
// uses to decide that a job hangs or lost a rank. Format and rules: docs/operations.md.
//
// When LOOM_HEARTBEAT_DIR is set, every rank keeps `<dir>/rank-00003.json` up to date (written
// atomically by temp + rename: by the rank itself at once on each change of step or phase, and
// by one background thread per process every 0.5 s between changes):
//
//   {"rank": 3, "world_size": 4, "pid": 1234, "host": "node7", "attempt": 0, "step": 57,
//    "phase": "forward_backward", "time": 1718000000.5, "progress_time": 1718000000.1,
//    "collective": {"op": "all_reduce", "group": "world", "seq": 230, "since": 1718000000.1},
//    "finished": false}
//
// `time` is when the file was written (the writer is alive), `progress_time` when the rank last
// changed step, phase or collective (it is making progress); times are seconds since the Unix
// epoch. `collective` is null unless the rank waits in one.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::ops {

inline constexpr const char* kHeartbeatDirEnv = "LOOM_HEARTBEAT_DIR";  // where ranks write heartbeats
inline constexpr const char* kRestartCountEnv = "LOOM_RESTART_COUNT";  // 0 on the first attempt

struct HeartbeatCollective {
  std::string op;     // all_reduce, barrier, send, ...
  std::string group;  // world, dp-0, ...
  int64_t seq = 0;    // sequence number on its group, as in the communication layer's errors
  double since = 0.0;
};

struct HeartbeatRecord {
  int rank = 0;  // world rank
  int world_size = 1;
  int64_t pid = 0;
  std::string host;
  int attempt = 0;  // LOOM_RESTART_COUNT of the run that wrote it
  int64_t step = 0;  // the step being worked on (0: before the first)
  std::string phase;  // setup, forward_backward, optimizer, checkpoint, eval, done
  double time = 0.0;
  double progress_time = 0.0;
  std::optional<HeartbeatCollective> collective;
  bool finished = false;  // training reached its last step
};

// rank-00003.json
std::string heartbeat_file_name(int rank);
std::string serialize_heartbeat(const HeartbeatRecord& record);
// nullopt when `text` is not a heartbeat (torn, foreign or from an older format).
std::optional<HeartbeatRecord> parse_heartbeat(std::string_view text);
// Writes `<dir>/rank-NNNNN.json` atomically (temp + rename; no fsync: heartbeats need not
// survive a crash). Throws loom::Error naming the file.
void write_heartbeat(const std::string& dir, const HeartbeatRecord& record);
// Every readable heartbeat in `dir` written by attempt `attempt`, by rank.
std::vector<HeartbeatRecord> read_heartbeats(const std::string& dir, int attempt);
// Removes every heartbeat file from `dir` (before an attempt starts).
void clear_heartbeats(const std::string& dir);

// "rank 1", "ranks 0,2,3"
std::string rank_list(const std::vector<int>& ranks);

// The supervisor's hang rule. A job hangs when, `timeout_s` after `started` (when its attempt
// began), a rank that has not finished made no progress for longer than `timeout_s`, or a rank
// of the world (or every rank) never wrote a heartbeat. Returns the diagnosis, or nullopt while
// the job is healthy. timeout_s <= 0 disables the rule. The diagnosis names the ranks that are
// stuck outside any collective (the likely culprits) first, then the ranks waiting in each
// collective, e.g. "no progress for 31.2 s (hang timeout 30 s): rank 2 (pid 1234 on n1) stuck
// for 31.2 s in forward_backward of step 57, not in a collective; ranks 0,1,3 waiting for 30.9 s
// in all_reduce on group 'dp-0' #230".
std::optional<std::string> diagnose_hang(const std::vector<HeartbeatRecord>& records, double now, double started,
                                         double timeout_s);

// Ranks that were reported by a process on `host` that no longer exists (per `alive(pid)`),
// and have not finished: their process died while the job goes on. Returns the diagnosis, or
// nullopt when none did.
std::optional<std::string> diagnose_dead_ranks(const std::vector<HeartbeatRecord>& records, const std::string& host,
                                               const std::function<bool(int64_t pid)>& alive);

// One line per record, for logs: "rank 0 step 5 forward_backward (all_reduce on 'world' #12)".
std::string summarize_heartbeats(const std::vector<HeartbeatRecord>& records);

// Seconds since the Unix epoch, now.
double wall_seconds();
std::string host_name();

}  // namespace loom::ops
