#pragma once
// The training state a rank writes to a checkpoint: its own shards of every parameter and its
// Adam moments, as slices of the global tensors. Every rank writes only what it owns (ckpt::
// SaveRank): a tensor-parallel rank its slices, a pipeline stage its layers, a data-parallel rank
// its part of the flat buffers (the ZeRO shards it owns; with ZeRO 0, an even split). So a
// checkpoint written at one layout is read at any other: each rank reads its own slices
// (load_training_checkpoint).
#include <cstdint>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/parameter_ranges.h"

namespace loom::train {

// The global slice a rank's parameter covers.
ckpt::Slice parameter_slice(const model::Parameter& p);

// The refs of this rank's shards: for every parameter it stores (not a copy another rank stores:
// a replicated one on the tensor-parallel ranks after the first, the tied head of a pipeline's
// last stage) and every owned range, the rectangles of the overlap (ckpt::flat_range_slices) as
// global slices of the parameter and its two moments (those of a range's arrays that are not null).
std::vector<ckpt::TensorRef> owned_training_state(const model::Transformer& model,
                                                  const std::vector<parallel::OwnedRange>& owned);

// The ranges readable on the host: as they are on the cpu; on a GPU copied into `storage` (one
// device-to-host copy per array that is not null, after the step's work), which must outlive
// their use.
std::vector<parallel::OwnedRange> host_ranges(Device device, std::vector<parallel::OwnedRange> ranges,
                                              std::vector<float>& storage);

}  // namespace loom::train
