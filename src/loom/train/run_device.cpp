#include "loom/train/run_device.h"

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
  // (Communicator::exchange_async: one NCCL group each), in orders where a send that waits for
  // its recv cannot deadlock them (parallel/pipeline/pipeline_rendezvous.h checks every schedule).
  comm::CommOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::llround(config.runtime.timeout_s * 1000.0)));
  return comm::route_device_buffers(world, device, options);
}

}  // namespace loom::train
