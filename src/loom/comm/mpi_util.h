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

#include "loom/core/dtype.h"

namespace loom::comm::mpi_detail {

// Throws loom::Error("<what>: <MPI's message>") unless rc is MPI_SUCCESS. Our communicators use
// MPI_ERRORS_RETURN, so every MPI failure reaches the caller as an Error instead of an abort.
void mpi_check(int rc, const std::string& what);
std::string mpi_error_string(int rc);

// The MPI datatype that moves `dtype` elements. bf16 and f16 travel as 16-bit words: MPI only
// copies them; every reduction of them is done in f32 (see mpi_transfer.cpp).
MPI_Datatype mpi_type(DType dtype);

using Clock = std::chrono::steady_clock;

// Pauses between MPI_Test polls. At first it polls as MPI's own blocking waits do, with only a
// yield between tests (so oversubscribed ranks still share the cores): sleeping there costs a
// large transfer that follows dearly, since a process that sleeps on a loaded machine gets its
// core back late (measured: +25-50% on back-to-back 64 MiB all-reduces, see
// docs/comm-benchmarks.md). A wait that lasts past kSpin is a late peer, not a busy one; it
// sleeps between tests, doubling up to 1 ms.
class Backoff {
 public:
  void pause() {
    if (Clock::now() - start_ < kSpin) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  static constexpr std::chrono::milliseconds kSpin{20};
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{10};
};

}  // namespace loom::comm::mpi_detail
