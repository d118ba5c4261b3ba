// Phase 1 of every collective of the mpi backend (see group.h): the agreement handshake, which
// proves that every rank arrived and that all agree on the operation.
#include <algorithm>
#include <map>

#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail {

Group::Poll Group::poll(CollectiveOp& op, std::optional<Clock::time_point> deadline, const char* what) {
  Backoff backoff;
  while (true) {
    int done = 0;
    mpi_check(MPI_Test(&op.pending, &done, MPI_STATUS_IGNORE),
              [&] { return label() + ": " + op.describe() + ": " + what; });
    if (done) return Poll::Done;
    counters_.progress();
    if (op.abandoned.load() || shutdown_.load()) return Poll::Abandoned;
    if (deadline && Clock::now() >= *deadline) {
      op.abandoned = true;
      return Poll::TimedOut;
    }
    backoff.pause();
  }
}

Group::Poll Group::handshake(CollectiveOp& op, std::optional<Clock::time_point> deadline) {
  op.descriptor = make_descriptor(op);
  for (int i = 0; i < kFields; ++i) {
    op.agreement[static_cast<size_t>(i)] = op.descriptor[static_cast<size_t>(i)];
    op.agreement[static_cast<size_t>(kFields + i)] = -op.descriptor[static_cast<size_t>(i)];
  }
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, op.agreement.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm_, &op.pending),
            [&] { return label() + ": " + op.describe() + ": handshake"; });
  if (Poll r = poll(op, deadline, "handshake"); r != Poll::Done) return r;

  bool agree = op.agreement[kInvalid] == 0;
  for (int i = 0; i < kFields; ++i) {
    agree = agree && op.agreement[static_cast<size_t>(i)] == -op.agreement[static_cast<size_t>(kFields + i)];
  }
  if (!agree) return disagreement(op, deadline);
  if (op.call.kind == CollectiveKind::AllToAllV) return check_pair_counts(op, deadline);
  return Poll::Done;
}

// Every rank saw the same disagreement, so every rank gathers the views and fails alike: throws
// naming each rank's view (unless the gathering is abandoned).
Group::Poll Group::disagreement(CollectiveOp& op, std::optional<Clock::time_point> deadline) {
  const std::string where = label() + ": " + op.describe();
  op.views.assign(static_cast<size_t>(size_) * kFields, 0);
  mpi_check(MPI_Iallgather(op.descriptor.data(), kFields, MPI_INT64_T, op.views.data(), kFields, MPI_INT64_T, comm_,
                           &op.pending),
            [&] { return where + ": gathering the ranks' views"; });
  if (Poll r = poll(op, deadline, "gathering the ranks' views"); r != Poll::Done) return r;
  std::map<Descriptor, std::vector<int>> by_view;
  for (int r = 0; r < size_; ++r) {
    Descriptor d{};
    std::copy_n(op.views.begin() + static_cast<std::ptrdiff_t>(r) * kFields, kFields, d.begin());
    by_view[d].push_back(r);
  }
  std::string message = where + ": the ranks disagree on the operation:";
  if (by_view.size() == 1) message = where + ": invalid arguments:";
  for (const auto& [view, ranks] : by_view) {
    message += (ranks.size() == 1 ? " rank " : " ranks ") + rank_ranges(ranks) + ": " + describe_descriptor(view) + ";";
  }
  message.pop_back();
  if (!op.invalid.empty()) message += ". This rank: " + op.invalid;
  throw Error(message);
}

// all_to_all_v: rank r's send count to this rank must equal this rank's receive count from r.
// Every rank learns of every mismatch and throws alike.
Group::Poll Group::check_pair_counts(CollectiveOp& op, std::optional<Clock::time_point> deadline) {
  auto where = [&] { return label() + ": " + op.describe(); };
  const std::vector<int64_t>& recv_counts = op.call.recv_counts;
  op.peer_sends.assign(static_cast<size_t>(size_), 0);
  mpi_check(MPI_Ialltoall(op.call.counts.data(), 1, MPI_INT64_T, op.peer_sends.data(), 1, MPI_INT64_T, comm_,
                          &op.pending),
            [&] { return where() + ": exchanging counts"; });
  if (Poll r = poll(op, deadline, "exchanging counts"); r != Poll::Done) return r;
  op.pair_report = {0, -1, 0, 0};
  for (int r = 0; r < size_; ++r) {
    if (op.peer_sends[static_cast<size_t>(r)] != recv_counts[static_cast<size_t>(r)]) {
      op.pair_report = {1, r, recv_counts[static_cast<size_t>(r)], op.peer_sends[static_cast<size_t>(r)]};
      break;
    }
  }
  op.pair_reports.assign(static_cast<size_t>(size_) * 4, 0);
  mpi_check(MPI_Iallgather(op.pair_report.data(), 4, MPI_INT64_T, op.pair_reports.data(), 4, MPI_INT64_T, comm_,
                           &op.pending),
            [&] { return where() + ": checking counts"; });
  if (Poll r = poll(op, deadline, "checking counts"); r != Poll::Done) return r;
  std::string message;
  for (int r = 0; r < size_; ++r) {
    const int64_t* report = op.pair_reports.data() + static_cast<ptrdiff_t>(r) * 4;
    if (report[0] == 0) continue;
    message += " rank " + std::to_string(r) + " expects " + std::to_string(report[2]) + " elements from rank " +
               std::to_string(report[1]) + ", which sends it " + std::to_string(report[3]) + ";";
  }
  if (message.empty()) return Poll::Done;
  message.pop_back();
  throw Error(where() + ": the ranks disagree on the counts:" + message);
}

}  // namespace loom::comm::mpi_detail
