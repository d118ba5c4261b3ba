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

std::vector<HostOffloadedOptimizer::Chunk> HostOffloadedOptimizer::plan_chunks(
    std::span<const ShardPiece> pieces) const {
  int64_t total = 0;
  for (const ShardPiece& p : pieces) total += p.numel;
  const int64_t slot = std::min(total, chunk_);
  reserve_staging(total > chunk_ ? 2 * slot : slot);
  std::vector<Chunk> chunks(1);
  int64_t used = 0;
  for (const ShardPiece& piece : pieces) {
    LOOM_CHECK(piece.param_bf16 == nullptr && piece.fp8.amax == nullptr,
               "optim.cpu_offload: the offloaded optimizer writes no bf16 copy or FP8 codes");
    for (int64_t done = 0; done < piece.numel;) {
      if (used == chunk_) {
        chunks.emplace_back();
        used = 0;
      }
      const int64_t n = std::min(piece.numel - done, chunk_ - used);
      const int64_t at = static_cast<int64_t>((chunks.size() - 1) % 2) * slot + used;
      float* param = piece.param + done;
      const float* grad = piece.grad + done;
      // Adjacent on the device too (a stage's pieces mostly are): one transfer for both.
      std::vector<Run>& runs = chunks.back().runs;
      if (!runs.empty() && runs.back().param + runs.back().n == param && runs.back().grad + runs.back().n == grad) {
        runs.back().n += n;
      } else {
        runs.push_back({param, grad, at, n});
      }
      ShardPiece host = piece;
      host.param = values_.data<float>() + at;
      host.grad = grads_.data<float>() + at;
      host.state = {piece.state[0] + done, piece.state[1] + done};
      host.numel = n;
      chunks.back().staged.push_back(host);
      used += n;
      done += n;
    }
  }
  return chunks;
}

void HostOffloadedOptimizer::update_on_host(std::span<const ShardPiece> pieces, const StepParams& step) const {
  const std::vector<Chunk> chunks = plan_chunks(pieces);
  Allocator& device = allocator(device_);
  float* values = values_.data<float>();
  float* grads = grads_.data<float>();
  std::vector<std::unique_ptr<DeviceFence>> down(chunks.size());
  auto send_down = [&](size_t c) {
    for (const Run& r : chunks[c].runs) {
      const size_t bytes = static_cast<size_t>(r.n) * sizeof(float);
      device.to_host_async(grads + r.at, r.grad, bytes);
      device.to_host_async(values + r.at, r.param, bytes);
    }
    down[c] = device.fence();
  };
  send_down(0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    // The next chunk comes down while this one is updated. Its slot held chunk c - 1, whose values
    // were queued up before: the device's order of work keeps them apart, and the host writes a
    // slot only after a fence past both.
    if (c + 1 < chunks.size()) send_down(c + 1);
    down[c]->wait();
    host_->update_many(chunks[c].staged, step);
    for (const Run& r : chunks[c].runs) {
      device.from_host_async(r.param, values + r.at, static_cast<size_t>(r.n) * sizeof(float));
    }
  }
  // Every value back on the device before the update returns: whoever reads them next, on any
  // queue, finds them there, and the staging is free for the next call.
  device.fence()->wait();
}

void HostOffloadedOptimizer::reserve_staging(int64_t elements) const {
  if (!values_.empty() && values_.numel() >= elements) return;
  values_ = Tensor();  // the old staging goes before the new is taken
  grads_ = Tensor();
  values_ = Tensor::transfer_staging({elements}, DType::F32, device_);
  grads_ = Tensor::transfer_staging({elements}, DType::F32, device_);
}

}  // namespace loom::optim
