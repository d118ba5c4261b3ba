#pragma once
// Model-state memory per rank for data parallelism with each ZeRO stage: what loom prints at
// start-up. N parameters, d data-parallel ranks, P bytes per parameter in the compute dtype,
// G bytes per gradient element in the full gradient buffer.
//
//   parameters  P                       (sharded: / d at zero 3)
//   gradients   G                       (sharded at zero >= 2)
//             + 4 when G < 4            (fp32 main gradients: sharded at zero >= 1)
//   master      4 when P < 4, else 0    (fp32 master weights; fp32 parameters are their own)
//   moments     8                       (Adam exp_avg and exp_avg_sq in fp32)
//   master and moments are sharded at zero >= 1.
//
// So with bf16 parameters and fp32 gradients (bytes per parameter):
//   zero 0: 2 + 4 + 4 + 8 = 18;  zero 1: 6 + 12/d;  zero 2: 2 + 16/d;  zero 3: 18/d,
// and Megatron's distributed-optimizer table holds: fp16/fp16 20 and 4 + 16/d, fp32/fp32 16 and
// 8 + 8/d (mixed-precision Adam: 2 + 4 + 4 + 4 + 4 bytes/param). A sharded quantity counts
// ceil(N / d) elements. Activations are not included.
#include <cstdint>
#include <string>

namespace loom::parallel {

struct MemoryModel {
  int64_t params = 0;
  int dp = 1;
  int zero = 0;                   // 0..3
  int param_bytes = 2;            // compute dtype: 2 (bf16/fp16) or 4 (fp32)
  int grad_bytes = 4;             // gradient buffer dtype: 2 or 4
  int64_t comm_buffer_bytes = 0;  // bucket staging etc., as the implementation allocates it
};

struct MemoryBytes {
  int64_t parameters = 0, gradients = 0, master_weights = 0, optimizer_moments = 0, communication_buffers = 0;
  // In host memory instead, not part of the device's total: the moments (optim.cpu_offload on a
  // GPU), ZeRO-3's parameter and gradient shards (parallel.offload_params).
  int64_t host_optimizer_moments = 0, host_parameters = 0, host_gradients = 0;
  int64_t total() const {
    return parameters + gradients + master_weights + optimizer_moments + communication_buffers;
  }
};

// Throws loom::Error for values outside the ranges above.
MemoryBytes memory_per_rank(const MemoryModel& model);

// "parameters 2.00 MiB, gradients ..., total ..." for the start-up report.
std::string describe_memory(const MemoryBytes& bytes);

}  // namespace loom::parallel
