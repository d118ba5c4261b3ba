#pragma once
// A model of the links between ranks, for the threads backend to simulate a topology: before
// every transfer between two ranks the backend calls transfer(), which may sleep to impose the
// link class's latency and bandwidth and counts bytes per link class.
#include <cstdint>

namespace loom::comm {

class LinkModel {
 public:
  virtual ~LinkModel() = default;
  // `bytes` move from world rank `source` to world rank `destination` (source != destination).
  // Called from the thread doing the transfer; must be thread-safe.
  virtual void transfer(int source, int destination, int64_t bytes) = 0;
};

}  // namespace loom::comm
