#pragma once
// The training state of a model split over a tensor-parallel group, as shards of global tensors:
// every parameter and its Adam moments under the parameter's global name and shape, each rank's
// part with its global slice. Checkpoints store this, so a checkpoint written at one tp size is
// read at any other (each rank reads its own slice, see load_training_checkpoint).
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/communicator.h"
#include "loom/model/transformer.h"

namespace loom::recipes {

struct ShardedTrainingState {
  std::vector<float> storage;            // gathered shards (empty with one rank: refs point at the model)
  std::vector<ckpt::TensorRef> tensors;  // into storage or the caller's buffers
};

// The global slice a rank's parameter covers.
ckpt::Slice parameter_slice(const model::Parameter& p);

// Collective over the model's tensor-parallel group (every rank calls it; all receive the same
// state). exp_avg / exp_avg_sq: this rank's full moments, laid out like its parameters. A copy
// held by several ranks is stored once (from the holder that counts it in the gradient norm).
ShardedTrainingState gather_sharded_training_state(const model::Transformer& model, const float* exp_avg,
                                                   const float* exp_avg_sq);

// Collective over the pipeline group: every stage's state (each gathered over its tensor-parallel
// group first) reaches pipeline rank 0, which returns all of them; the other stages get {}.
ShardedTrainingState gather_pipeline_state(const ShardedTrainingState& stage, comm::Communicator& pp);

}  // namespace loom::recipes
