#pragma once
// The training side of heartbeats (format: heartbeat.h): each rank of `loom train` holds a
// `Heartbeat` and tells it its step and phase. Each change of step or phase is written at once;
// one background thread per process rewrites every registered rank's file every 0.5 s between
// changes (fresh `time`, and the collective the rank waits in, from comm/activity.h). Without
// LOOM_HEARTBEAT_DIR in the environment it does nothing.
#include <cstdint>
#include <string_view>

namespace loom::ops {

class Heartbeat {
 public:
  Heartbeat(int world_rank, int world_size);
  ~Heartbeat();  // writes a last record and unregisters
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool active() const { return active_; }
  // The rank now works on `step` in `phase` (forward_backward, optimizer, checkpoint, eval).
  void phase(std::string_view phase, int64_t step);
  // Training ended (phase "done"); `finished` when it reached its last step. Written at once.
  void done(bool finished, int64_t step);

 private:
  int rank_;
  bool active_ = false;
};

}  // namespace loom::ops
