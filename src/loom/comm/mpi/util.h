#pragma once
// Small helpers shared by the mpi backend's files: error checking, dtype mapping, polling.
// The C API only: Open MPI's and MPICH's deprecated C++ bindings would otherwise come along.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <type_traits>

#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom::comm::mpi_detail {

std::string mpi_error_string(int rc);

// Throws loom::Error("<what>: <MPI's message>") unless rc is MPI_SUCCESS. Our communicators use
// MPI_ERRORS_RETURN, so every MPI failure reaches the caller as an Error instead of an abort.
// `what` is a string or, on hot paths, a callable returning one, so that the message is only
// built on failure.
template <typename What>
void mpi_check(int rc, What&& what) {
  if (rc == MPI_SUCCESS) [[likely]] return;
  if constexpr (std::is_invocable_v<What>) {
    throw Error(std::string(what()) + ": " + mpi_error_string(rc));
  } else {
    throw Error(std::string(what) + ": " + mpi_error_string(rc));
  }
}

// The MPI datatype that moves `dtype` elements. bf16 and f16 travel as 16-bit words: MPI only
// copies them; every reduction of them is done in f32 (see mpi/transfer.cpp).
MPI_Datatype mpi_type(DType dtype);

using Clock = std::chrono::steady_clock;

// Pauses between MPI_Test polls, in three stages:
// - the first kSpin: nothing, polling as MPI's own blocking calls do. A peer a few microseconds
//   behind is the common case, and a yield there costs more than the wait whenever anything else
//   is runnable (measured here: an 8-byte all-reduce 3 us without yields, 8-12 us with them).
// - then, up to kYield: a yield between polls, so that oversubscribed ranks (8 processes on 2
//   cores in the tests) still share the cores.
// - beyond: the peer is late, not busy; sleep between polls, doubling up to 1 ms. Sleeping
//   earlier costs the transfers that follow dearly, since a process that sleeps on a loaded
//   machine gets its core back late.
class Backoff {
 public:
  void pause() {
    const auto waited = Clock::now() - start_;
    if (waited < kSpin) return;
    if (waited < kYield) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  static constexpr std::chrono::microseconds kSpin{50};
  static constexpr std::chrono::milliseconds kYield{20};
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{10};
};

}  // namespace loom::comm::mpi_detail
