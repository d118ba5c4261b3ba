#pragma once
// `loom bench hardware`: measures this host as a hardware file (hardware.h) for `loom plan time`
// and `loom plan search`: the GEMM rate of a square 2048 sgemm (peak) and of a training-shaped
// one (achieved: gemm_efficiency), the memory bandwidth of a large copy, the precision recipes'
// casts of a GEMM operand (to bf16, to FP8), the Mamba-2 scan kernels' rate, how fast memory
// handed back to the system between uses faults in again (ZeRO-2/3, compact parameters), and the
// threads backend's all-reduce latency and bandwidth (comm/comm_bench.h) as the same-node link. Rates
// are one core's (one thread); the host's cores are shared by every rank of the threads backend:
// the file says shared: true and how many cores, and how much faster the training-shaped GEMM and
// the elementwise kernels run on every processor than on one thread, which the plan gives a rank
// in proportion to its threads (train.threads, or every processor, over the ranks).
#include <ostream>
#include <string>

#include "loom/plan/hardware.h"

namespace loom::plan {

struct CalibrationOptions {
  int ranks = 2;          // threads-backend ranks for the link measurement
  int64_t gemm_rows = 2048, gemm_inner = 256, gemm_cols = 1024;  // the training-shaped GEMM
  int repeats = 5;
};

// Prints what it measures to `log` (may be null).
Hardware measure_host(const CalibrationOptions& options, std::ostream* log);

// The hardware as a YAML file parse_hardware reads back.
std::string hardware_yaml(const Hardware& hardware, const std::string& comment);

}  // namespace loom::plan
