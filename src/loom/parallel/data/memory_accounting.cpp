#include "loom/parallel/data/memory_accounting.h"

#include <cstdio>
#include <utility>

#include "loom/core/error.h"

namespace loom::parallel {

MemoryBytes memory_per_rank(const MemoryModel& m) {
  LOOM_CHECK(m.params >= 0, "memory_per_rank: params must be >= 0 (got " + std::to_string(m.params) + ")");
  LOOM_CHECK(m.dp >= 1, "memory_per_rank: dp must be >= 1 (got " + std::to_string(m.dp) + ")");
  LOOM_CHECK(m.zero >= 0 && m.zero <= 3, "memory_per_rank: zero must be 0..3 (got " + std::to_string(m.zero) + ")");
  LOOM_CHECK(m.param_bytes == 2 || m.param_bytes == 4,
        "memory_per_rank: param_bytes must be 2 (bf16/fp16) or 4 (fp32) (got " + std::to_string(m.param_bytes) + ")");
  LOOM_CHECK(m.grad_bytes == 2 || m.grad_bytes == 4,
        "memory_per_rank: grad_bytes must be 2 or 4 (got " + std::to_string(m.grad_bytes) + ")");
  LOOM_CHECK(m.comm_buffer_bytes >= 0, "memory_per_rank: comm_buffer_bytes must be >= 0");

  const int64_t full = m.params;
  const int64_t shard = (m.params + m.dp - 1) / m.dp;
  auto n = [&](bool sharded) { return sharded ? shard : full; };

  MemoryBytes b;
  b.parameters = m.param_bytes * n(m.zero >= 3);
  b.gradients = m.grad_bytes * n(m.zero >= 2);
  if (m.grad_bytes < 4) b.gradients += 4 * n(m.zero >= 1);  // fp32 main gradients for the optimizer
  b.master_weights = m.param_bytes < 4 ? 4 * n(m.zero >= 1) : 0;
  b.optimizer_moments = 8 * n(m.zero >= 1);
  b.communication_buffers = m.comm_buffer_bytes;
  return b;
}

std::string describe_memory(const MemoryBytes& b) {
  auto mib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(text);
  };
  std::string text = "parameters " + mib(b.parameters) + ", gradients " + mib(b.gradients) + ", master weights " +
                     mib(b.master_weights) + ", optimizer moments " + mib(b.optimizer_moments) +
                     ", communication buffers " + mib(b.communication_buffers) + ", total " + mib(b.total());
  const std::pair<const char*, int64_t> on_host[] = {{"parameters", b.host_parameters},
                                                     {"gradients", b.host_gradients},
                                                     {"optimizer moments", b.host_optimizer_moments}};
  for (const auto& [what, bytes] : on_host) {
    if (bytes > 0) text += std::string("; ") + what + " in host memory " + mib(bytes);
  }
  return text;
}

}  // namespace loom::parallel
