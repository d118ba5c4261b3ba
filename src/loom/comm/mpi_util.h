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

// Pauses between MPI_Test polls: a few yields (a peer a few microseconds behind costs no
// sleep), then sleeps doubling up to 200 us, so that oversubscribed ranks (8 processes on 2
// cores in the tests) leave the cores to the ranks that still have work.
class Backoff {
 public:
  void pause() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(200));
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{2};
};

using Clock = std::chrono::steady_clock;

}  // namespace loom::comm::mpi_detail
