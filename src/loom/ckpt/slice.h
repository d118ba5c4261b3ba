#pragma once
// Slices of global tensors: the region a shard covers, one [start, length] pair per dimension.
// A shard's bytes are the row-major elements of its slice, so a reader can place them in any
// target layout. Rectangular slices cover every layout loom has: tensor/expert parallel splits
// are rectangles, and a ZeRO rank's flat range of a row-major tensor splits into at most
// 2*ndim-1 rectangles (see `flat_range_slices`).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/tensor.h"

namespace loom::ckpt {

using Slice = std::vector<std::pair<int64_t, int64_t>>;  // per dim: {start, length}

// The slice covering all of `shape`.
Slice full_slice(const Shape& shape);
Shape slice_shape(const Slice& slice);
int64_t slice_numel(const Slice& slice);
std::string slice_string(const Slice& slice);
// Throws loom::Error naming `what` unless `slice` has one pair per dimension of `shape`,
// non-negative starts and lengths, and lies inside `shape`.
void check_slice(const Slice& slice, const Shape& shape, const std::string& what);
// True when the two slices share at least one element.
bool slices_overlap(const Slice& a, const Slice& b);
// The common part of two slices of one tensor; false when they share no element.
bool intersect_slices(const Slice& a, const Slice& b, Slice* out);
// Copies the elements of `region` from `src` (holding the row-major elements of `src_slice`)
// into `dst` (holding those of `dst_slice`). `region` must lie inside both.
void copy_region(const void* src, const Slice& src_slice, void* dst, const Slice& dst_slice,
                 const Slice& region, size_t element_size);
// The rectangles covering elements [begin, begin + count) of `shape` in row-major order, in
// that order: how a flat (ZeRO-style) range of a tensor is stored as shards.
std::vector<Slice> flat_range_slices(const Shape& shape, int64_t begin, int64_t count);

}  // namespace loom::ckpt
