// A thread's compute queue (core/compute_queue.h): 0 by default, set for a scope and restored,
// per thread, never negative.
#include <gtest/gtest.h>

#include <thread>

#include "loom/core/compute_queue.h"
#include "loom/core/error.h"

namespace loom {
namespace {

TEST(ComputeQueue, ScopesNestAndRestoreTheThreadsQueue) {
  EXPECT_EQ(compute_queue(), 0);
  {
    ComputeQueueScope outer(3);
    EXPECT_EQ(compute_queue(), 3);
    {
      ComputeQueueScope inner(7);
      EXPECT_EQ(compute_queue(), 7);
    }
    EXPECT_EQ(compute_queue(), 3);
    int other_thread_queue = -1;
    std::thread([&] { other_thread_queue = compute_queue(); }).join();
    EXPECT_EQ(other_thread_queue, 0);  // a new thread starts on the process's queue
  }
  EXPECT_EQ(compute_queue(), 0);
}

TEST(ComputeQueue, ANegativeQueueIsAnErrorNamingIt) {
  try {
    ComputeQueueScope bad(-2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compute queue -2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(compute_queue(), 0);
}

}  // namespace
}  // namespace loom
