#include "loom/parallel/data/diloco.h"

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data/communication.h"

namespace loom::parallel {

DilocoOuter::DilocoOuter(comm::Communicator& across, float* params, int64_t total, Device device,
                         DilocoOptions options)
    : across_(across), params_(params), total_(total), device_(device), options_(options) {
  LOOM_CHECK(options_.outer_steps >= 1 && options_.fragments >= 1 && options_.fragments <= options_.outer_steps,
             "parallel.outer_fragments " + std::to_string(options_.fragments) + " must be in [1, parallel.outer_steps = " +
                 std::to_string(options_.outer_steps) + "]: each fragment syncs at its own step of the " +
                 std::to_string(options_.outer_steps));
  anchor_ = Tensor({total_}, DType::F32, device_);
  momentum_ = Tensor({total_}, DType::F32, device_);
  delta_ = Tensor({(total_ + options_.fragments - 1) / options_.fragments}, DType::F32, device_);
  reset();
}

void DilocoOuter::reset() {
  copy_on_device(device_, anchor(), params_, total_);
  zero_on_device(device_, momentum(), total_);
}

bool DilocoOuter::syncs_at(int64_t step) const {
  const int64_t h = options_.outer_steps, f = options_.fragments;
  for (int64_t k = 0; k < f; ++k) {
    if (step % h == k * h / f) return true;
  }
  return false;
}

bool DilocoOuter::after_step(int64_t step) {
  const int64_t h = options_.outer_steps, f = options_.fragments;
  bool changed = false;
  for (int64_t k = 0; k < f; ++k) {
    if (step % h != k * h / f) continue;
    sync(total_ * k / f, total_ * (k + 1) / f);
    changed = true;
  }
  return changed;
}

void DilocoOuter::sync(int64_t begin, int64_t end) {
  const int64_t n = end - begin;
  // delta = anchor - parameters, as (-parameters) + anchor: the same rounding, one sign flip exact.
  float* delta = delta_.data<float>();
  copy_on_device(device_, delta, params_ + begin, n);
  kernels::scale_in_place(device_, delta, n, -1.0f);
  kernels::add_in_place(device_, delta, anchor() + begin, n);
  average_over_sites(across_, delta, n);
  if (across_.size() > 1) bytes_ += 2 * n * 4 * (across_.size() - 1) / across_.size();
  kernels::nesterov_outer_update(device_, anchor() + begin, momentum() + begin, delta, n,
                                 static_cast<float>(options_.outer_lr), static_cast<float>(options_.outer_momentum));
  copy_on_device(device_, params_ + begin, anchor() + begin, n);
}

}  // namespace loom::parallel
