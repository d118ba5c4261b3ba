#pragma once
// optim.cpu_offload (Megatron-Core's --optimizer-cpu-offload, DeepSpeed's ZeRO-Offload): the
// optimizer of parameters that live on a GPU, with its per-element state (AdamW's two moments)
// in host memory and its arithmetic on the host's cores. The data-parallel stages allocate that
// state as optim/moment_arrays.h says (all of it on the host, or its first optim.offload_fraction)
// and hand their pieces over as always: the values and gradients on the device, each piece's
// moments on the host or on the device (ShardPiece::state_on_host); a piece whose moments are on
// the device is updated there.
//
// An update copies the host pieces' gradients and values down into host staging (pinned on a
// GPU), a run of adjacent pieces per transfer, has the host optimizer update them there, and
// copies the values back: the host optimizer's arithmetic exactly, 8 bytes per element off the
// device for 12 bytes moved each step. Staging holds at most kOffloadChunkElements of each at a
// time (a larger call goes chunk by chunk, a piece split where a chunk ends), in two slots used in
// turn, so that the transfers overlap the host's arithmetic (Megatron-Core's
// --overlap-cpu-optimizer-d2h-h2d): while the host updates one chunk, the next comes down and the
// previous goes back up, queued without waits (Allocator::to_host_async / from_host_async) and
// waited for by fences. It writes no bf16 copy or FP8 codes: the stages then round the values
// themselves and the model casts its weights (writes_bf16_copies() is false).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/tensor.h"
#include "loom/optim/optimizer.h"

namespace loom::optim {

// Elements of gradients (and as many of values) staged on the host at a time: 64 MiB each.
constexpr int64_t kOffloadChunkElements = int64_t{16} << 20;

class HostOffloadedOptimizer final : public Optimizer {
 public:
  // `host`: the optimizer that runs on the host; `on_device`: the same optimizer on `device`, for
  // the pieces whose moments are there; `device`: where the pieces' values and gradients live;
  // `chunk`: the staging's elements (tests make it small).
  HostOffloadedOptimizer(std::unique_ptr<Optimizer> host, std::unique_ptr<Optimizer> on_device, Device device,
                         int64_t chunk = kOffloadChunkElements);

  void update(const ShardPiece& piece, const StepParams& step) const override;
  void update_many(std::span<const ShardPiece> pieces, const StepParams& step) const override;

 private:
  // One transfer each way: `n` elements of values and gradients at `param` and `grad` on the
  // device, staged from element `at` of the staging arrays.
  struct Run {
    float* param = nullptr;
    const float* grad = nullptr;
    int64_t at = 0, n = 0;
  };
  // At most chunk_ elements in one staging slot: its transfers and its pieces as the host updates
  // them there.
  struct Chunk {
    std::vector<Run> runs;
    std::vector<ShardPiece> staged;
  };
  void update_on_host(std::span<const ShardPiece> pieces, const StepParams& step) const;
  // The pieces cut into chunks, chunk c in staging slot c % 2 (one slot when one chunk holds them).
  std::vector<Chunk> plan_chunks(std::span<const ShardPiece> pieces) const;

  // Host memory of the device's transfer staging (Tensor::transfer_staging: pinned for a GPU),
  // grown as calls need and kept between steps.
  void reserve_staging(int64_t elements) const;

  std::unique_ptr<Optimizer> host_, on_device_;
  Device device_;
  int64_t chunk_;
  mutable Tensor values_, grads_;
};

}  // namespace loom::optim
