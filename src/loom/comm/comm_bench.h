#pragma once
// `loom bench comm`: time each collective per message size on whatever backend runs it, and
// report algorithm and bus bandwidth with nccl-tests' definitions, so the numbers compare with
// nccl-tests and with a bare MPI program (bench/peers/mpi_allreduce_peer.c).
//
// Sizes follow nccl-tests: for all_reduce, broadcast and reduce the size is the buffer each rank
// passes; for all_gather the size of the gathered result; for reduce_scatter the size of the
// input each rank passes; for all_to_all the size each rank sends in all. algbw = size / time;
// busbw = algbw * 2(n-1)/n (all_reduce), * (n-1)/n (all_gather, reduce_scatter, all_to_all),
// * 1 (broadcast, reduce). The time is the slowest rank's mean over the timed iterations.
// `memcpy` times a plain copy of `size` bytes on every rank at once (busbw = algbw), the
// ceiling a shared-memory all-reduce is compared with.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/dtype.h"

namespace loom::comm {

struct CommBenchOptions {
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"};
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{256} << 20;
  int iters = 20;
  int warmup = 5;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  bool check_agreement = true;  // mpi backend: the per-collective agreement handshake
};

struct CommBenchRow {
  std::string op;
  int64_t bytes = 0;  // the size as defined above
  int64_t count = 0;  // elements per rank in the call (per peer for all_to_all)
  double seconds = 0;
  double algbw_gbps = 0;  // GB/s, 1e9 bytes
  double busbw_gbps = 0;
};

// The names --ops accepts.
std::vector<std::string> comm_bench_ops();
// busbw / algbw for `op` on `ranks` ranks.
double bus_bandwidth_factor(const std::string& op, int ranks);
// "8", "4096", "64K", "256M", "1G" (binary multiples; an optional trailing "B"/"iB" is allowed).
int64_t parse_byte_size(const std::string& text);
// Collective over `world`: every op at every power-of-two size from min_bytes to max_bytes.
// Rows are printed to `out` (pass it on one rank only) as they complete, and returned on every
// rank. Throws loom::Error for an unknown op or a bad range.
std::vector<CommBenchRow> run_comm_bench(Communicator& world, const CommBenchOptions& options, std::ostream* out);

}  // namespace loom::comm
