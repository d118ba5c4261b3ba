// The test program that CTest starts under mpirun (4 and 8 ranks): MPI is set up through the
// mpi backend's own run_mpi, the tests run inside it, and only rank 0 prints the usual gtest
// report; the other ranks print their failures only, prefixed with their rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "loom/comm/mpi/backend.h"
#include "mpi_test_util.h"

namespace loom::mpi_test {

namespace {

comm::Communicator* g_world = nullptr;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }

 private:
  int rank_;
};

}  // namespace

comm::Communicator& world() { return *g_world; }
void set_world(comm::Communicator* world) { g_world = world; }

}  // namespace loom::mpi_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int status = 1;
  loom::comm::LaunchOptions options;
  options.backend = "mpi";
  // Generous for 8 ranks on 2 cores, yet a hang still ends long before CTest's limit.
  options.comm.timeout = std::chrono::seconds(120);
  loom::comm::run_mpi(options, [&](loom::comm::Communicator& world) {
    loom::mpi_test::set_world(&world);
    if (world.rank() != 0) {
      ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new loom::mpi_test::FailurePrinter(world.rank()));
    }
    float failed = RUN_ALL_TESTS() != 0 ? 1.0f : 0.0f;
    world.all_reduce(&failed, 1, loom::DType::F32, loom::comm::ReduceOp::Max);
    status = failed != 0.0f ? 1 : 0;
    loom::mpi_test::set_world(nullptr);
  });
  return status;
}
