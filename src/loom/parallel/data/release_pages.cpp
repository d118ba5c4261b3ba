#include "loom/parallel/data/release_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace loom::parallel {

void release_pages(float* base, int64_t begin, int64_t numel) {
  if (numel <= 0) return;
  static const uintptr_t page = [] {
    const long size = ::sysconf(_SC_PAGESIZE);
    return static_cast<uintptr_t>(size > 0 ? size : 4096);
  }();
  char* start = reinterpret_cast<char*>(base + begin);
  char* end = reinterpret_cast<char*>(base + begin + numel);
  char* first = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + page - 1) / page * page);
  char* last = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(end) / page * page);
  if (last > first && ::madvise(first, static_cast<size_t>(last - first), MADV_DONTNEED) == 0) {
    std::memset(start, 0, static_cast<size_t>(first - start));
    std::memset(last, 0, static_cast<size_t>(end - last));
  } else {
    std::memset(start, 0, static_cast<size_t>(end - start));
  }
}

}  // namespace loom::parallel
