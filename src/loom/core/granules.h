#pragma once
// The granule arithmetic of Allocator::decommit / commit (core/device.h), shared by the
// allocators that give memory back in granules (a GPU's physical chunks, the emulated device's
// host pages): for a byte range [offset, offset + bytes) of an allocation, which granules lie
// wholly inside it (decommitted), which parts lie on granules shared with neighbouring data
// (zeroed), and which granules it touches (committed).
#include <algorithm>
#include <cstddef>
#include <vector>

namespace loom {

struct GranuleRange {
  size_t first = 0, last = 0;  // granule indices [first, last)
  bool empty() const { return last <= first; }
};

// A part of the range on a granule it shares with neighbouring data.
struct GranuleEdge {
  size_t offset = 0, bytes = 0, granule = 0;
};

inline GranuleRange whole_granules(size_t offset, size_t bytes, size_t granule) {
  const size_t first = (offset + granule - 1) / granule, last = (offset + bytes) / granule;
  return first < last ? GranuleRange{first, last} : GranuleRange{};
}

inline GranuleRange touched_granules(size_t offset, size_t bytes, size_t granule) {
  if (bytes == 0) return {};
  return {offset / granule, (offset + bytes + granule - 1) / granule};
}

// The parts of [offset, offset + bytes) outside its whole granules: none, one or two.
inline std::vector<GranuleEdge> granule_edges(size_t offset, size_t bytes, size_t granule) {
  std::vector<GranuleEdge> edges;
  const size_t end = offset + bytes;
  const GranuleRange whole = whole_granules(offset, bytes, granule);
  const size_t head_end = whole.empty() ? end : whole.first * granule;
  // Without whole granules the range covers at most two partial ones: split at the boundary.
  const size_t split = whole.empty() ? std::min(end, (offset / granule + 1) * granule) : head_end;
  if (split > offset) edges.push_back({offset, split - offset, offset / granule});
  const size_t tail_begin = whole.empty() ? split : whole.last * granule;
  if (end > tail_begin) edges.push_back({tail_begin, end - tail_begin, tail_begin / granule});
  return edges;
}

}  // namespace loom
