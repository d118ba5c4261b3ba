#pragma once
// A stage's AdamW moments (exp_avg, exp_avg_sq) for n elements laid out like its state, the first
// `on_host` of them in host memory and the rest on the parameters' device: all on the device by
// default, all on the host under optim.cpu_offload, the first optim.offload_fraction of them under
// both (Megatron-Core's --optimizer-offload-fraction). The stages take a range's moments as one
// part, or two where the range crosses into device memory, and hand each part to the optimizer as
// a piece of its own (HostOffloadedOptimizer updates a piece where its moments are).
#include <cstdint>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/core/device.h"
#include "loom/core/tensor.h"

namespace loom::optim {

// The share of a stage's state with its moments in host memory: optim.offload_fraction under
// optim.cpu_offload on a GPU (`on_gpu`), else none. The planner counts with it too.
double offloaded_share(const config::OptimConfig& config, bool on_gpu);
// How many of a stage's n state elements that share is (rounded to the nearest).
int64_t offloaded_elements(const config::OptimConfig& config, bool on_gpu, int64_t n);

class MomentArrays {
 public:
  MomentArrays() = default;
  MomentArrays(int64_t n, int64_t on_host, Device device);

  // Elements [begin, begin + n) of the state, by the memory their moments are in.
  struct Part {
    int64_t begin = 0, n = 0;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    bool on_host = false;      // in host memory while the parameters are on a device
    Device device;             // where exp_avg and exp_avg_sq are
  };
  std::vector<Part> parts(int64_t begin, int64_t n) const;

  int64_t size() const { return n_; }
  int64_t host_elements() const { return on_host_; }
  int64_t device_elements() const { return n_ - on_host_; }

 private:
  int64_t n_ = 0, on_host_ = 0;
  Device device_;
  mutable Tensor host_exp_avg_, host_exp_avg_sq_, exp_avg_, exp_avg_sq_;  // parts() hands out their pointers
};

}  // namespace loom::optim
