#include "loom/optim/host_offload.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.h"

namespace loom::optim {

HostOffloadedOptimizer::HostOffloadedOptimizer(std::unique_ptr<Optimizer> host, std::unique_ptr<Optimizer> on_device,
                                               Device device, int64_t chunk)
    : host_(std::move(host)),
      on_device_(std::move(on_device)),
      device_(device),
      chunk_(chunk) {
  LOOM_CHECK(chunk_ > 0, "optim.cpu_offload: the staging chunk must hold at least one element");
  LOOM_CHECK(host_ != nullptr && on_device_ != nullptr, "optim.cpu_offload: an optimizer for the host and the device");
  LOOM_CHECK(!device_.is_cpu(), "optim.cpu_offload: the parameters are already in host memory");
}

void HostOffloadedOptimizer::update(const ShardPiece& piece, const StepParams& step) const {
  update_many({&piece, 1}, step);
}

void HostOffloadedOptimizer::update_many(std::span<const ShardPiece> pieces, const StepParams& step) const {
  // Each piece where its moments are (optim.offload_fraction leaves some on the device).
  std::vector<ShardPiece> on_host, on_device;
  for (const ShardPiece& piece : pieces) (piece.state_on_host ? on_host : on_device).push_back(piece);
  if (!on_device.empty()) on_device_->update_many(on_device, step);
  if (!on_host.empty()) update_on_host(on_host, step);
}

void HostOffloadedOptimizer::update_on_host(std::span<const ShardPiece> pieces, const StepParams& step) const {
  int64_t total = 0;
  for (const ShardPiece& p : pieces) total += p.numel;
  reserve_staging(std::min(total, chunk_));
  std::vector<Run> runs;
  std::vector<ShardPiece> staged;
  int64_t used = 0;
  auto flush = [&] {
    update_staged(runs, staged, step);
    runs.clear();
    staged.clear();
    used = 0;
  };
  for (const ShardPiece& piece : pieces) {
    LOOM_CHECK(piece.param_bf16 == nullptr && piece.fp8.amax == nullptr,
               "optim.cpu_offload: the offloaded optimizer writes no bf16 copy or FP8 codes");
    for (int64_t done = 0; done < piece.numel;) {
      if (used == chunk_) flush();
      const int64_t n = std::min(piece.numel - done, chunk_ - used);
      float* param = piece.param + done;
      const float* grad = piece.grad + done;
      // Adjacent on the device too (a stage's pieces mostly are): one transfer for both.
      if (!runs.empty() && runs.back().param + runs.back().n == param && runs.back().grad + runs.back().n == grad) {
        runs.back().n += n;
      } else {
        runs.push_back({param, grad, used, n});
      }
      ShardPiece host = piece;
      host.param = values_.data<float>() + used;
      host.grad = grads_.data<float>() + used;
      host.state = {piece.state[0] + done, piece.state[1] + done};
      host.numel = n;
      staged.push_back(host);
      used += n;
      done += n;
    }
  }
  if (!staged.empty()) flush();
}

void HostOffloadedOptimizer::update_staged(std::span<const Run> runs, std::span<const ShardPiece> staged,
                                           const StepParams& step) const {
  for (const Run& r : runs) {
    copy_to_host(device_, grads_.data<float>() + r.at, r.grad, r.n);
    copy_to_host(device_, values_.data<float>() + r.at, r.param, r.n);
  }
  host_->update_many(staged, step);
  for (const Run& r : runs) copy_from_host(device_, r.param, values_.data<float>() + r.at, r.n);
}

void HostOffloadedOptimizer::reserve_staging(int64_t elements) const {
  if (!values_.empty() && values_.numel() >= elements) return;
  values_ = Tensor();  // the old staging goes before the new is taken
  grads_ = Tensor();
  values_ = Tensor::transfer_staging({elements}, DType::F32, device_);
  grads_ = Tensor::transfer_staging({elements}, DType::F32, device_);
}

}  // namespace loom::optim
