#pragma once
// Where a tensor-parallel rank's parameter sits in the global tensor, and how the tensor-parallel
// ranks' gradients of it combine. Checkpoints store global tensors; initialisation draws each
// element from its global index, so every layout starts from the same model.
#include <cstdint>

#include "loom/core/tensor.h"

namespace loom::model {

// How the gradient of a parameter held by several tensor-parallel ranks becomes whole.
enum class TpGradSync : uint8_t {
  None,            // each rank's gradient is already complete (split, or identical copies)
  SumOverHolders,  // partial sums: add the gradients of every rank holding the same slice
                   // (norms under sequence parallelism, kv heads replicated for GQA)
};

struct ShardSpec {
  Shape global_shape;             // empty: the local shape (a full copy on every rank)
  int split_dim = -1;             // -1: not split
  int64_t start = 0, length = 0;  // this rank's slice along split_dim
  TpGradSync grad_sync = TpGradSync::None;
  // Whether this rank adds the parameter to the global gradient norm: a copy held by several
  // ranks counts once (on the first of its holders).
  bool counts_in_norm = true;

  bool is_split() const { return split_dim >= 0; }
};

// Flat index in the global tensor of element `local_index` of the local shard of `local_shape`.
int64_t global_index(const ShardSpec& spec, const Shape& local_shape, int64_t local_index);

// The local shard as contiguous runs of the flat global tensor (what copies between the two
// move): run k holds local elements [k * length, (k + 1) * length) at global offset
// first + k * global_stride. An unsplit tensor is one run.
struct ShardRuns {
  int64_t count = 1, length = 0, first = 0, global_stride = 0;
};
ShardRuns shard_runs(const ShardSpec& spec, const Shape& local_shape);

// The global shape of a parameter (its local shape when not split).
inline const Shape& global_shape(const ShardSpec& spec, const Shape& local_shape) {
  return spec.global_shape.empty() ? local_shape : spec.global_shape;
}

// Balanced split of `n` over `parts`: the first index of part `p` (part p holds [first(p), first(p+1))).
inline int64_t balanced_first(int64_t n, int parts, int p) { return n * p / parts; }

}  // namespace loom::model
