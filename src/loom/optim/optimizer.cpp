#include "loom/optim/optimizer.h"

#include "loom/optim/adamw.h"
#include "loom/optim/host_offload.h"

namespace loom::optim {

std::unique_ptr<Optimizer> make_optimizer(const config::OptimConfig& config, Device device) {
  if (config.cpu_offload && !device.is_cpu()) {
    return std::make_unique<HostOffloadedOptimizer>(std::make_unique<AdamW>(config, Device::cpu()),
                                                    std::make_unique<AdamW>(config, device), device);
  }
  return std::make_unique<AdamW>(config, device);
}

float clip_factor(const config::OptimConfig& config, double global_norm) {
  if (config.clip_grad > 0.0 && global_norm > config.clip_grad) {
    return static_cast<float>(config.clip_grad / (global_norm + 1e-6));
  }
  return 1.0f;
}

}  // namespace loom::optim
