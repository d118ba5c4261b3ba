#pragma once
// How the ZeRO stages move elements between the model's flat buffers and their shard state,
// wherever the buffers live: through the device's allocator (copies, zeroes, pages or granules
// given back) and the kernels entries (the wire dtype's rounding and widening, additions), so on a
// GPU (runtime.device=cuda) the host never touches the elements.
#include <cstddef>
#include <cstdint>

#include "loom/core/device.h"
#include "loom/core/dtype.h"

namespace loom::parallel {

// The n elements at `src` converted to the wire dtype into `dst`, then zero padding up to
// `padded` elements (the padding adds nothing to any shard: zero bits are +0 in every dtype).
void stage_for_reduce(Device device, std::byte* dst, const float* src, int64_t n, int64_t padded, DType wire);
// A reduced shard of n elements in the wire dtype into fp32 `dst`: added to it (accumulate, as
// micro-batches do) or written over it.
void take_reduced(Device device, float* dst, const std::byte* received, int64_t n, DType wire, bool accumulate);
// Elements [begin, begin + numel) of `base` (releasable memory: the model's flat buffers) read
// as zero from now on and their whole granules give their memory back (Allocator::decommit: on
// the cpu the pages go back to the system, on a GPU the granules are unmapped).
void release_range(Device device, float* base, int64_t begin, int64_t numel);
// Elements [begin, begin + numel) of `base` may be written again (Allocator::commit): released
// elements read as zero. A GPU has no demand paging: every write into a released range (a
// gather, backward's gradients, a checkpoint load) comes after this; on the cpu a no-op.
void commit_range(Device device, float* base, int64_t begin, int64_t numel);

}  // namespace loom::parallel
