// Named ranges (core/trace.h): what reaches the calling thread's sink, and only that thread's.
#include "loom/core/trace.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace loom::trace {
namespace {

// Each open as "+name", each close as "-".
class Recorder : public Sink {
 public:
  void open(const char* name) noexcept override { calls.push_back(std::string("+") + name); }
  void close() noexcept override { calls.push_back("-"); }
  std::vector<std::string> calls;
};

TEST(TraceRange, OpensAndClosesOnTheThreadsSinkInNestingOrder) {
  Recorder recorder;
  EXPECT_EQ(set_thread_sink(&recorder), nullptr);
  {
    Range step("step", 3);
    Range block("block", 12, "forward");
    Range plain("optimizer");
  }
  EXPECT_EQ(set_thread_sink(nullptr), &recorder);
  EXPECT_EQ(recorder.calls,
            (std::vector<std::string>{"+step 3", "+block 12 forward", "+optimizer", "-", "-", "-"}));
}

TEST(TraceRange, EndClosesOnceAndTheDestructorThenDoesNothing) {
  Recorder recorder;
  set_thread_sink(&recorder);
  {
    Range outer("outer");
    Range inner("inner");
    inner.end();
    inner.end();
    Range next("next");
  }
  set_thread_sink(nullptr);
  EXPECT_EQ(recorder.calls, (std::vector<std::string>{"+outer", "+inner", "-", "+next", "-", "-"}));
}

TEST(TraceRange, LongNamesAreCutAt63Characters) {
  Recorder recorder;
  set_thread_sink(&recorder);
  const std::string long_name(100, 'x');
  { Range range(long_name.c_str(), 7, "forward"); }
  set_thread_sink(nullptr);
  ASSERT_EQ(recorder.calls.size(), 2u);
  EXPECT_EQ(recorder.calls[0], "+" + std::string(63, 'x'));
}

TEST(TraceRange, ASinkHearsOnlyItsOwnThreadAndARangeClosesInTheSinkItOpenedIn) {
  Recorder mine, theirs;
  set_thread_sink(&mine);
  std::thread other([&] {
    set_thread_sink(&theirs);
    Range range("other thread");
  });
  other.join();
  {
    Range range("this thread");
    set_thread_sink(nullptr);  // changed while the range is open: it still closes in `mine`
  }
  EXPECT_EQ(mine.calls, (std::vector<std::string>{"+this thread", "-"}));
  EXPECT_EQ(theirs.calls, (std::vector<std::string>{"+other thread", "-"}));
}

}  // namespace
}  // namespace loom::trace
