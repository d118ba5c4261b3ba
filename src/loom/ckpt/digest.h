#pragma once
// One digest of a checkpoint's model parameters as global tensors, so checkpoints written by
// different layouts (or with different optimizer state) can be compared: `loom ckpt digest`.
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"

namespace loom::ckpt {

// XXH3-128 (32 lowercase hex digits) over the model parameters sorted by global name: for each,
// its name, dtype, shape and global row-major bytes, reassembled from however it was sharded.
// Optimizer state and the trainer state do not enter it. Reads verify every shard checksum.
std::string parameter_digest(const LoadedCheckpoint& checkpoint);
// A checkpoint directory, or a root (then the checkpoint `load_checkpoint` settles on).
std::string parameter_digest(const std::string& path_or_root);
// The same digest of tensors held in memory as shards (a serving engine's tensor-parallel ranks):
// the refs of model parameters (other names are left out, as from a checkpoint) must tile each
// tensor exactly, as a save's do.
std::string parameter_digest(const std::vector<TensorRef>& refs);

}  // namespace loom::ckpt
