#pragma once
// Returning the memory of part of a large host buffer to the operating system while keeping its
// address range: the whole pages inside [ptr, ptr + bytes) are dropped (they read as zero and
// cost nothing until written again: a write fault brings each back), the partial pages at the
// ends, shared with neighbouring data, are zeroed in place. Whole 2 MiB pages inside the range
// are marked for transparent huge pages, so they fault back in 2 MiB at a time. The host
// allocator's decommit (core/device.h).
#include <cstddef>

namespace loom {

void release_pages(void* ptr, size_t bytes);

}  // namespace loom
