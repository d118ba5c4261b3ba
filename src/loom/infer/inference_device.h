#pragma once
// The device an engine's rank runs on (`loom serve --device`, EngineOptions::device): `cuda` starts
// the CUDA backend (an Error with the runtime's reason where it cannot) and gives tensor-parallel
// rank r the GPU r modulo the GPUs, as training does with runtime.device.
#include "loom/config/run_config.h"
#include "loom/core/device.h"

namespace loom::infer {

Device inference_device(config::RuntimeDevice device, int rank);

}  // namespace loom::infer
