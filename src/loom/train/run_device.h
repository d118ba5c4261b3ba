#pragma once
// runtime.device: the device a rank trains on. `cuda` starts the CUDA backend (an Error with the
// runtime's reason where it cannot) and gives rank r the GPU r modulo the GPUs; what does not
// run on a GPU yet is an Error naming its setting before anything is built.
#include <memory>

#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/core/device.h"

namespace loom::train {

Device training_device(const config::RunConfig& config, int world_rank, int world_size);

// The world a rank on `device` communicates through: on a GPU with a backend that moves host
// bytes (threads, mpi), `world` staging device buffers through the host (comm/device_staging.h);
// nullptr where `world` serves as it is (the CPU; NCCL).
std::unique_ptr<comm::Communicator> staging_communicator(Device device, comm::Communicator& world);

}  // namespace loom::train
