#include "loom/optim/moment_arrays.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "loom/core/error.h"

namespace loom::optim {

double offloaded_share(const config::OptimConfig& config, bool on_gpu) {
  return config.cpu_offload && on_gpu ? config.offload_fraction : 0.0;
}

int64_t offloaded_elements(const config::OptimConfig& config, bool on_gpu, int64_t n) {
  return std::clamp<int64_t>(std::llround(offloaded_share(config, on_gpu) * static_cast<double>(n)), 0, n);
}

MomentArrays::MomentArrays(int64_t n, int64_t on_host, Device device) : n_(n), on_host_(on_host), device_(device) {
  LOOM_CHECK(on_host >= 0 && on_host <= n && (on_host == 0 || !device.is_cpu()),
             "MomentArrays: " + std::to_string(on_host) + " of " + std::to_string(n) + " elements in host memory on " +
                 device.name());
  // Only a side that holds elements allocates (an empty Tensor would still take a byte of it).
  if (on_host > 0) {
    host_exp_avg_ = Tensor({on_host}, DType::F32, Device::cpu());
    host_exp_avg_sq_ = Tensor({on_host}, DType::F32, Device::cpu());
  }
  if (n > on_host) {
    exp_avg_ = Tensor({n - on_host}, DType::F32, device);
    exp_avg_sq_ = Tensor({n - on_host}, DType::F32, device);
  }
}

std::vector<MomentArrays::Part> MomentArrays::parts(int64_t begin, int64_t n) const {
  LOOM_CHECK(begin >= 0 && n >= 0 && begin + n <= n_,
             "MomentArrays: elements [" + std::to_string(begin) + ", " + std::to_string(begin + n) + ") outside " +
                 std::to_string(n_));
  std::vector<Part> out;
  const int64_t end = begin + n;
  if (begin < on_host_) {
    const int64_t last = std::min(end, on_host_);
    out.push_back({begin, last - begin, host_exp_avg_.data<float>() + begin, host_exp_avg_sq_.data<float>() + begin,
                   true, Device::cpu()});
  }
  if (end > on_host_ && n > 0) {
    const int64_t first = std::max(begin, on_host_);
    out.push_back({first, end - first, exp_avg_.data<float>() + (first - on_host_),
                   exp_avg_sq_.data<float>() + (first - on_host_), false, device_});
  }
  return out;
}

}  // namespace loom::optim
