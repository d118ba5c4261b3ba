#pragma once
// Returning the memory of part of a large buffer to the operating system while keeping its
// address range: the whole pages inside [begin, begin + numel) are dropped (they read as zero and
// cost nothing until written again), the partial pages at the ends, shared with neighbouring
// data, are zeroed in place. Whole 2 MiB pages inside the range are marked for transparent huge
// pages, so they fault back in 2 MiB at a time.
#include <cstdint>

namespace loom::parallel {

void release_pages(float* base, int64_t begin, int64_t numel);

}  // namespace loom::parallel
