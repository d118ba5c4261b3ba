#pragma once
// Arrival counters of one mpi group: every rank publishes the sequence number of the last
// collective it entered on the group, and a rank whose wait times out reads everyone's to name
// the ranks that never arrived. Beside it each rank counts its polls of a handshake in progress,
// so that when every rank entered, the one whose count stands still (a stopped or stuck process)
// can be named too. The counters live in an MPI window (two int64 per rank):
// - the whole group on one node: MPI_Win_allocate_shared; a reader loads its peers' counters
//   directly, so it gets an answer even from a peer that is busy computing and never enters MPI;
// - otherwise: MPI_Win_allocate, held in a passive-target epoch (MPI_Win_lock_all) for the
//   group's life and read with MPI_Rget. Whether that completes while a peer stays out of MPI
//   depends on the one-sided transport (RDMA networks do; a software fallback may not), so the
//   read has a time budget and reports the counters it could not get as unknown.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/mpi/util.h"

namespace loom::comm::mpi_detail {

class ArrivalCounters {
 public:
  // Collective over `comm`. Never throws: when no window can be made the counters are
  // unavailable and description() says why.
  void create(MPI_Comm comm, bool prefer_shared_memory);
  // Hands the window over to free_retired_windows(). MPI_Win_free waits for every member, so a
  // group's destructor does not call it: a member that failed (and unwinds, or never gets
  // there) would leave the others blocked in it. Local; no communication.
  void retire();

  // This rank entered collective `seq` (a store into its own slot; no communication).
  void arrive(int64_t seq) {
    if (local_ != nullptr) std::atomic_ref<int64_t>(local_[0]).store(seq, std::memory_order_release);
  }
  // This rank polled a handshake once more (only its own communication thread writes its slot).
  void progress() {
    if (local_ == nullptr) return;
    std::atomic_ref<int64_t> polls(local_[1]);
    polls.store(polls.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  // This rank timed out and stops polling: its poll count turns negative, so that ranks timing
  // out at the same moment do not name each other as stopped.
  void give_up() {
    if (local_ != nullptr) std::atomic_ref<int64_t>(local_[1]).store(-2, std::memory_order_release);
  }
  // Every rank's counters; -1 where they could not be read within `budget`. Thread-safe.
  struct Reading {
    int64_t entered = -1, polls = -1;
  };
  std::vector<Reading> read(std::chrono::milliseconds budget);

  bool available() const { return win_ != MPI_WIN_NULL; }
  const std::string& description() const { return description_; }

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  int64_t order_ = 0;  // creation order in this process, the order windows are freed in
  bool shared_ = false;
  int size_ = 0;
  int64_t* local_ = nullptr;
  std::vector<int64_t*> peers_;  // shared-memory mode: each rank's slot, mapped here
  bool leaked_requests_ = false;
  std::string description_ = "unavailable: not created";
};

// Frees every retired window, in creation order (a collective order every member shares, since
// groups are created collectively). run_mpi calls it once every rank has finished its work, just
// before MPI_Finalize. Windows whose reads left requests in flight are left to MPI_Finalize.
void free_retired_windows();

}  // namespace loom::comm::mpi_detail
