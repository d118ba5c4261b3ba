#include "loom/comm/mpi/backend.h"

#include <cstdio>

#include "loom/comm/mpi/communicator.h"
#include "loom/comm/mpi/role_world.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {

using mpi_detail::Clock;

// How long a rank whose body failed waits for the others to finish theirs before it aborts
// the job: long enough for an error every rank raised at once, short enough to fail fast.
constexpr std::chrono::seconds kFailureGrace{3};

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "level " + std::to_string(level);
}

[[noreturn]] void abort_job(int rank, const std::string& message) {
  std::fprintf(stderr, "loom: rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever did
}

const mpi_detail::MpiCommunicator& as_mpi(const Communicator& comm) {
  const auto* mpi = dynamic_cast<const mpi_detail::MpiCommunicator*>(&comm);
  LOOM_CHECK(mpi != nullptr, "communicator '" + comm.name() + "' is a " + comm.backend() + "-backend one, not mpi");
  return *mpi;
}

}  // namespace

MpiOptions mpi_options(const Communicator& comm) { return as_mpi(comm).group().options(); }

void set_mpi_options(Communicator& comm, const MpiOptions& options) {
  const_cast<mpi_detail::MpiCommunicator&>(as_mpi(comm)).group().set_options(options);
}

std::string mpi_arrival_counters(const Communicator& comm) { return as_mpi(comm).group().counters_description(); }

void run_mpi(const LaunchOptions& options, const std::function<void(Communicator& world)>& body) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  LOOM_CHECK(!finalized, "mpi backend: MPI was already finalised in this process (run_mpi runs once per process)");
  const bool own = !initialized;
  int provided = MPI_THREAD_SINGLE;
  if (own) {
    mpi_detail::mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "mpi backend: MPI_Init_thread");
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (own) MPI_Finalize();
    throw Error("mpi backend: the MPI library provides " + thread_level_name(provided) +
                ", but each group's communication thread needs MPI_THREAD_MULTIPLE (use an MPI built with thread "
                "support, e.g. Open MPI >= 3)");
  }
  int rank = 0;
  // The job's world, or this process's role part of it (comm/role_world.h).
  MPI_Comm job = mpi_detail::job_world();
  MPI_Comm_rank(job, &rank);
  // A communicator of its own for the end-of-job handshake, untouched by whatever `body` left.
  MPI_Comm finish = MPI_COMM_NULL;
  MPI_Comm world_comm = MPI_COMM_NULL;
  mpi_detail::mpi_check(MPI_Comm_dup(job, &finish), "mpi backend: MPI_Comm_dup");
  mpi_detail::mpi_check(MPI_Comm_dup(job, &world_comm), "mpi backend: MPI_Comm_dup");
  mpi_detail::start_ticker();
  MpiOptions mpi;
  mpi.comm = options.comm;
  auto world = std::make_unique<mpi_detail::MpiCommunicator>(mpi_detail::Group::create(world_comm, "world", mpi));

  std::exception_ptr error;
  try {
    body(*world);
  } catch (...) {
    error = std::current_exception();
  }

  // Did any rank fail, and which first? max(failed) and max(-rank of a failed one).
  int64_t flags[2] = {error ? 1 : 0, error ? -static_cast<int64_t>(rank) : INT64_MIN};
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, flags, 2, MPI_INT64_T, MPI_MAX, finish, &request);
  const auto deadline = Clock::now() + kFailureGrace;
  mpi_detail::Backoff backoff;
  while (true) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    // A rank that finished cleanly waits as long as the others work, as MPI_Finalize would.
    if (error && Clock::now() >= deadline) {
      abort_job(rank, "error: " + describe_exception(error) + "\nloom: rank " + std::to_string(rank) +
                          ": the other ranks did not finish within " + std::to_string(kFailureGrace.count()) +
                          " s; aborting the job so that none waits for this one");
    }
    backoff.pause();
  }

  world.reset();
  mpi_detail::stop_ticker();
  std::string stuck;
  if (mpi_detail::communication_thread_stuck(&stuck)) {
    abort_job(rank, (error ? "error: " + describe_exception(error) + "\nloom: rank " + std::to_string(rank) + ": " : "") + stuck +
                        "; aborting instead of finalising MPI");
  }
  // Every rank is here (the handshake above proved it), so the collective frees cannot hang.
  mpi_detail::free_retired_windows();
  MPI_Comm_free(&finish);
  if (own) MPI_Finalize();  // a process that joined its role world: leave_role_world() does
  if (error) std::rethrow_exception(error);
  if (flags[0] != 0) {
    throw Error("mpi backend: rank " + std::to_string(-flags[1]) + " failed (its error is printed by that rank); rank " +
                std::to_string(rank) + " finished its part");
  }
}

}  // namespace loom::comm
