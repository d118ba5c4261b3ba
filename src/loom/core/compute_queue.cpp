#include "loom/core/compute_queue.h"

#include <string>

#include "loom/core/error.h"

namespace loom {

namespace {
thread_local int this_thread_queue = 0;
}  // namespace

int compute_queue() { return this_thread_queue; }

ComputeQueueScope::ComputeQueueScope(int queue) : previous_(this_thread_queue) {
  LOOM_CHECK(queue >= 0, "compute queue " + std::to_string(queue) + ": queues are numbered from 0");
  this_thread_queue = queue;
}

ComputeQueueScope::~ComputeQueueScope() { this_thread_queue = previous_; }

}  // namespace loom
