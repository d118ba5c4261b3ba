#include "loom/comm/mpi/arrival.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "loom/comm/mpi/util.h"

namespace loom::comm::mpi_detail {

namespace {

constexpr int kSlot = 2;  // per rank: the last collective entered, the handshake polls

// Serialises reads of one process's windows: reads happen only on the timeout path.
std::mutex& read_mutex() {
  static std::mutex mutex;
  return mutex;
}

struct Retired {
  int64_t order;
  MPI_Win win;
  bool shared;
};

std::mutex g_retired_mutex;
std::vector<Retired> g_retired;
std::atomic<int64_t> g_created{0};

}  // namespace

void ArrivalCounters::create(MPI_Comm comm, bool prefer_shared_memory) {
  MPI_Comm_size(comm, &size_);
  order_ = ++g_created;
  bool on_one_node = false;
  if (prefer_shared_memory) {
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
        node != MPI_COMM_NULL) {
      int node_size = 0;
      MPI_Comm_size(node, &node_size);
      // Every rank must take the same branch (window creation is collective).
      int local = node_size == size_ ? 1 : 0;
      int all = 0;
      MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm);
      on_one_node = all == 1;
      MPI_Comm_free(&node);
    }
  }
  if (on_one_node) {
    int rc = MPI_Win_allocate_shared(kSlot * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, comm, &local_, &win_);
    if (rc != MPI_SUCCESS) {
      win_ = MPI_WIN_NULL;
      local_ = nullptr;
      description_ = "unavailable: MPI_Win_allocate_shared failed: " + mpi_error_string(rc);
      return;
    }
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    shared_ = true;
    peers_.assign(static_cast<size_t>(size_), nullptr);
    for (int r = 0; r < size_; ++r) {
      MPI_Aint bytes = 0;
      int unit = 0;
      int64_t* slot = nullptr;
      if (MPI_Win_shared_query(win_, r, &bytes, &unit, &slot) == MPI_SUCCESS) peers_[static_cast<size_t>(r)] = slot;
    }
    description_ = "shared-memory window";
  } else {
    int rc = MPI_Win_allocate(kSlot * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, comm, &local_, &win_);
    if (rc != MPI_SUCCESS) {
      win_ = MPI_WIN_NULL;
      local_ = nullptr;
      description_ = "unavailable: MPI_Win_allocate failed: " + mpi_error_string(rc);
      return;
    }
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, win_);
    if (rc != MPI_SUCCESS) {
      MPI_Win_free(&win_);
      win_ = MPI_WIN_NULL;
      local_ = nullptr;
      description_ = "unavailable: MPI_Win_lock_all failed: " + mpi_error_string(rc);
      return;
    }
    description_ = "rma window";
  }
  local_[0] = 0;
  local_[1] = 0;
  // Nobody reads a slot before its owner zeroed it.
  MPI_Barrier(comm);
}

void ArrivalCounters::retire() {
  if (win_ == MPI_WIN_NULL) return;
  // An Rget that never completed would make MPI_Win_unlock_all wait: such a window stays.
  if (!leaked_requests_) {
    std::lock_guard<std::mutex> lock(g_retired_mutex);
    g_retired.push_back({order_, win_, shared_});
  }
  win_ = MPI_WIN_NULL;
  local_ = nullptr;
  peers_.clear();
}

void free_retired_windows() {
  std::vector<Retired> retired;
  {
    std::lock_guard<std::mutex> lock(g_retired_mutex);
    retired.swap(g_retired);
  }
  std::sort(retired.begin(), retired.end(), [](const Retired& a, const Retired& b) { return a.order < b.order; });
  for (Retired& r : retired) {
    if (!r.shared) MPI_Win_unlock_all(r.win);
    MPI_Win_free(&r.win);
  }
}

std::vector<ArrivalCounters::Reading> ArrivalCounters::read(std::chrono::milliseconds budget) {
  std::vector<Reading> values(static_cast<size_t>(size_));
  if (win_ == MPI_WIN_NULL) return values;
  std::lock_guard<std::mutex> lock(read_mutex());
  if (shared_) {
    for (int r = 0; r < size_; ++r) {
      int64_t* slot = peers_[static_cast<size_t>(r)];
      if (slot != nullptr) {
        values[static_cast<size_t>(r)] = {std::atomic_ref<int64_t>(slot[0]).load(std::memory_order_acquire),
                                          std::atomic_ref<int64_t>(slot[1]).load(std::memory_order_acquire)};
      }
    }
    return values;
  }
  // The buffer must outlive any request that does not complete in time, so it is heap-held and
  // released only when every request finished.
  auto* buffer = new int64_t[static_cast<size_t>(kSlot * size_)];
  std::vector<MPI_Request> requests(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    buffer[kSlot * r] = buffer[kSlot * r + 1] = -1;
    MPI_Rget(&buffer[kSlot * r], kSlot, MPI_INT64_T, r, 0, kSlot, MPI_INT64_T, win_, &requests[static_cast<size_t>(r)]);
  }
  const auto deadline = Clock::now() + budget;
  Backoff backoff;
  while (true) {
    int done = 0;
    MPI_Testall(size_, requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done || Clock::now() >= deadline) break;
    backoff.pause();
  }
  for (int r = 0; r < size_; ++r) {
    int done = 0;
    MPI_Request& request = requests[static_cast<size_t>(r)];
    if (request == MPI_REQUEST_NULL ||
        (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)) {
      values[static_cast<size_t>(r)] = {buffer[kSlot * r], buffer[kSlot * r + 1]};
    }
  }
  bool pending = false;
  for (MPI_Request request : requests) pending = pending || request != MPI_REQUEST_NULL;
  if (!pending) {
    delete[] buffer;
  } else {
    leaked_requests_ = true;  // buffer intentionally kept: MPI may still write into it
  }
  return values;
}

}  // namespace loom::comm::mpi_detail
