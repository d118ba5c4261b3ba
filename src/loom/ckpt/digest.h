#pragma once
// One digest of a checkpoint's model parameters as global tensors, so checkpoints written by
// different layouts (or with different optimizer state) can be compared: `loom ckpt digest`.
#include <string>

#include "loom/ckpt/checkpoint.h"

namespace loom::ckpt {

// XXH3-128 (32 lowercase hex digits) over the model parameters sorted by global name: for each,
// its name, dtype, shape and global row-major bytes, reassembled from however it was sharded.
// Optimizer state and the trainer state do not enter it. Reads verify every shard checksum.
std::string parameter_digest(const LoadedCheckpoint& checkpoint);
// A checkpoint directory, or a root (then the checkpoint `load_checkpoint` settles on).
std::string parameter_digest(const std::string& path_or_root);

}  // namespace loom::ckpt
