#pragma once
// The checks that depend on the world size: tensor x context x pipeline parallelism divides the world,
// parallel.dp agrees with what is left, and the global batch splits into micro-batches on every
// data-parallel rank. Run by each rank when the world exists, and before any rank is created
// when the world size is known up front (the threads backend's runtime.ranks).
#include <cstdint>
#include <string>

#include "loom/comm/mesh.h"
#include "loom/config/run_config.h"

namespace loom::train {

// The mesh shape `config` gives on `world_size` ranks; throws loom::Error naming the keys when
// the layout does not fit.
comm::MeshShape check_layout(const config::RunConfig& config, int world_size);

// What every step's global batch is a multiple of on `dp` data-parallel ranks: train.micro_batch
// x dp, x parallel.pp under the interleaved schedule (its micro-batches go in rounds of the
// stages); `what` names those factors for messages.
struct BatchUnit {
  int64_t rows = 0;
  std::string what;
};
BatchUnit batch_unit(const config::RunConfig& config, int dp);

}  // namespace loom::train
