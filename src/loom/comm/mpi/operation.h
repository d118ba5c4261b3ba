#pragma once
// One collective of the mpi backend as it travels through its group: the call's arguments
// (CollectiveCall, arguments.h), the MPI call that moves its data (a Transfer), and the state of
// its issue, handshake and wait (group.h). Every collective is such an operation and goes the
// same way; what differs between them is only their arguments and their Transfer.
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/arguments.h"
#include "loom/comm/mpi/util.h"

namespace loom::comm::mpi_detail {

class Group;
struct CollectiveOp;

// Phase 2 of a collective: the MPI call(s) that move its data, run by the executing thread once
// the handshake proved every rank there (transfer.h has those of the data collectives).
using Transfer = std::function<void(Group& group, CollectiveOp& op)>;

// The fields every rank must agree on, all-reduced as max(x) and max(-x) (= -min) in one call.
enum DescriptorField : int { kKind, kDType, kCount, kReduce, kRoot, kCountsHash, kInvalid, kFields };
using Descriptor = std::array<int64_t, kFields>;
Descriptor make_descriptor(const CollectiveOp& op);
// "all_reduce (f32 x 1024, sum)".
std::string describe_descriptor(const Descriptor& d);

struct CollectiveOp {
  CollectiveCall call;
  Transfer transfer;
  std::string invalid;  // this rank's argument problem (argument_problem); empty when valid

  // Settings captured at issue, so that set_mpi_options() affects later operations only.
  bool check_agreement = true;
  int64_t max_elements = INT_MAX;

  int64_t seq = 0;  // 1-based position among this group's collectives
  Clock::time_point issued{};
  enum class Phase { Queued, Handshake, Transfer, Done, Failed };
  Phase phase = Phase::Queued;  // guarded by the group's mutex
  std::exception_ptr error;     // with Phase::Failed
  std::atomic<bool> abandoned{false};

  // Handshake buffers. MPI may still write them after an abandoned handshake, so an abandoned
  // operation is kept alive for the rest of the process (see keep_alive()).
  Descriptor descriptor{};
  std::array<int64_t, 2 * kFields> agreement{};
  std::vector<int64_t> views;          // every rank's descriptor, gathered on disagreement
  std::vector<int64_t> peer_sends;     // all_to_all_v: what each peer will send this rank
  std::array<int64_t, 4> pair_report{};  // all_to_all_v: (bad, peer, expected, announced)
  std::vector<int64_t> pair_reports;
  MPI_Request pending = MPI_REQUEST_NULL;

  // "all_reduce #7 (f32 x 1024, sum)".
  std::string describe() const;
};

// Keeps `object` alive until the process exits: for buffers MPI may still write after the
// operation that owned them was abandoned.
void keep_alive(std::shared_ptr<void> object);
// Records that a communication thread had to be left blocked inside MPI (see Group::close).
void mark_communication_thread_stuck(const std::string& what);
// True once that happened; `what` says where.
bool communication_thread_stuck(std::string* what);

// "0-3,5,7-8".
std::string rank_ranges(const std::vector<int>& ranks);

}  // namespace loom::comm::mpi_detail
