#pragma once
// runtime.device: the device a rank trains on. `cuda` starts the CUDA backend (an Error with the
// runtime's reason where it cannot) and gives rank r the GPU r modulo the GPUs; what does not
// run on a GPU yet is an Error naming its setting before anything is built.
#include "loom/config/run_config.h"
#include "loom/core/device.h"

namespace loom::train {

Device training_device(const config::RunConfig& config, int world_rank, int world_size);

}  // namespace loom::train
