#include "loom/train/run_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "loom/comm/device_staging.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::train {

Device training_device(const config::RunConfig& config, int world_rank, int world_size) {
  if (config.runtime.device == config::RuntimeDevice::Cpu) return Device::cpu();
  int devices = 0;
  try {
    devices = kernels::start_cuda();
  } catch (const Error& e) {
    throw Error(std::string("runtime.device=cuda: ") + e.what());
  }
  LOOM_CHECK(devices > 0, "runtime.device=cuda: the CUDA backend serves no GPU");
  // Ranks of one process (the threads backend) share the GPUs; NCCL refuses two on one.
  LOOM_CHECK(config.runtime.device_comm != config::DeviceComm::Nccl || config.runtime.backend != config::Backend::Threads ||
                 world_size <= devices,
             "runtime.device_comm=nccl: " + std::to_string(world_size) + " ranks of this process on " +
                 std::to_string(devices) + " GPU(s), but NCCL needs a GPU per rank; use runtime.device_comm=host "
                 "(device buffers staged through the host) or fewer ranks");
  return Device::cuda(world_rank % devices);
}

std::unique_ptr<comm::Communicator> device_world(const config::RunConfig& config, Device device,
                                                 comm::Communicator& world) {
  const bool nccl = config.runtime.device_comm == config::DeviceComm::Nccl;
  LOOM_CHECK(!nccl || device.is_cuda(), "runtime.device_comm=nccl needs runtime.device=cuda");
  if (device.is_cpu()) return nullptr;
  if (!nccl) return comm::stage_device_buffers(world, device);
  // The pipeline's stages and ring attention's hops send and receive as batches
  // (Communicator::exchange_async: one NCCL group each), so NCCL's pairing of sends and recvs in
  // issue order cannot deadlock them; except the interleaved schedule with more micro-batches
  // than stages, whose neighbours each wait in a batch for a recv the other posts only in its
  // next one (only buffered sends serve that order).
  const int model_ranks = std::max(1, config.parallel.tp * config.parallel.cp * config.parallel.pp);
  const int dp = std::max(1, world.size() / model_ranks);
  const int64_t micro_batches = config.train.global_batch / std::max<int64_t>(1, int64_t{dp} * config.train.micro_batch);
  LOOM_CHECK(config.parallel.pp == 1 || config.parallel.pipeline_schedule != config::PipelineScheduleKind::Interleaved ||
                 micro_batches <= config.parallel.pp,
             "parallel.pipeline_schedule=interleaved with " + std::to_string(micro_batches) +
                 " micro-batches per step on parallel.pp=" + std::to_string(config.parallel.pp) +
                 " stages with runtime.device_comm=nccl: its stages' sends and recvs would deadlock there (NCCL "
                 "pairs them in issue order, a batch at a time); use as many micro-batches as stages (train.global_batch "
                 "/ (dp x train.micro_batch)), parallel.pipeline_schedule=1f1b, or runtime.device_comm=host");
  comm::CommOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::llround(config.runtime.timeout_s * 1000.0)));
  return comm::route_device_buffers(world, device, options);
}

}  // namespace loom::train
