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

// The world a rank on `device` communicates through (comm/device_staging.h): on a GPU, `world`
// (threads or mpi) with its device buffers staged through the host (runtime.device_comm = host)
// or sent over NCCL (nccl); nullptr on the CPU, where `world` serves as it is. Collective.
std::unique_ptr<comm::Communicator> device_world(const config::RunConfig& config, Device device,
                                                 comm::Communicator& world);

}  // namespace loom::train
