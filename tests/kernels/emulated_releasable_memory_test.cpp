// Releasable memory on the emulated CUDA device (tests/support/emulated_cuda.h), the device side
// of Allocator::decommit / commit (core/device.h): a decommitted page dies on any access, by the
// device's own copies as by its kernels; committed again it reads zero; the allocator counts
// committed bytes; the partial pages at a range's ends keep their memory and are zeroed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <vector>

#include "loom/core/device.h"
#include "loom/core/granules.h"
#include "loom/kernels/ops.h"
#include "support/emulated_cuda.h"

namespace loom::testing {
namespace {

int64_t page_floats() { return static_cast<int64_t>(::sysconf(_SC_PAGESIZE)) / static_cast<int64_t>(sizeof(float)); }

std::vector<float> download(const float* d, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  copy_to_host(Device::cuda(0), host.data(), d, n);
  return host;
}

// `pages` pages of ones on the device, in releasable memory.
DeviceBuffer<float> ones(int64_t pages) {
  DeviceBuffer<float> d = DeviceBuffer<float>::releasable(Device::cuda(0), pages * page_floats());
  const std::vector<float> host(static_cast<size_t>(d.size()), 1.0f);
  copy_from_host(Device::cuda(0), d.data(), host.data(), d.size());
  return d;
}

TEST(EmulatedReleasableMemory, DecommitGivesBackWholePagesAndCommitBringsThemBackZeroed) {
  install_emulated_cuda();
  Allocator& a = allocator(Device::cuda(0));
  const int64_t page = page_floats(), before = a.bytes_in_use();
  DeviceBuffer<float> d = ones(4);
  EXPECT_EQ(a.bytes_in_use() - before, 4 * page * 4);
  // From the middle of page 0 to the middle of page 3: pages 1 and 2 go, the ends are zeroed.
  a.decommit(d.data() + page / 2, static_cast<size_t>(3 * page) * sizeof(float));
  EXPECT_EQ(a.bytes_in_use() - before, 2 * page * 4);
  EXPECT_TRUE(emulated_committed(Device::cuda(0), d.data()));
  EXPECT_FALSE(emulated_committed(Device::cuda(0), d.data() + page));
  EXPECT_FALSE(emulated_committed(Device::cuda(0), d.data() + 2 * page));
  EXPECT_TRUE(emulated_committed(Device::cuda(0), d.data() + 3 * page));
  const std::vector<float> head = download(d.data(), page), tail = download(d.data() + 3 * page, page);
  for (int64_t i = 0; i < page; ++i) {
    EXPECT_EQ(head[i], i < page / 2 ? 1.0f : 0.0f) << i;
    EXPECT_EQ(tail[i], i < page / 2 ? 0.0f : 1.0f) << i;
  }
  // Decommitting again changes nothing; committing a part brings back the pages it touches.
  a.decommit(d.data() + page / 2, static_cast<size_t>(3 * page) * sizeof(float));
  EXPECT_EQ(a.bytes_in_use() - before, 2 * page * 4);
  a.commit(d.data() + page + 1, 4);
  EXPECT_EQ(a.bytes_in_use() - before, 3 * page * 4);
  for (float x : download(d.data() + page, page)) EXPECT_EQ(x, 0.0f);
  a.commit(d.data(), d.bytes());
  EXPECT_EQ(a.bytes_in_use() - before, 4 * page * 4);
  const std::vector<float> all = download(d.data(), d.size());
  for (int64_t i = 0; i < d.size(); ++i) EXPECT_EQ(all[i], i < page / 2 || i >= 3 * page + page / 2 ? 1.0f : 0.0f) << i;
  // Freed with pages decommitted: the count comes back to where it was.
  a.decommit(d.data(), d.bytes());
  d.release();
  EXPECT_EQ(a.bytes_in_use(), before);
}

TEST(EmulatedReleasableMemoryDeathTest, DecommittedMemoryDiesOnAnyAccess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  install_emulated_cuda();
  const int64_t page = page_floats();
  DeviceBuffer<float> d = ones(3);
  allocator(Device::cuda(0)).decommit(d.data() + page, static_cast<size_t>(page) * sizeof(float));
  std::vector<float> host(static_cast<size_t>(page), 2.0f);
  float* released = d.data() + page;
  const auto segfault = ::testing::KilledBySignal(SIGSEGV);
  EXPECT_EXIT(download(released + 5, 1), segfault, "");  // a transfer to the host
  EXPECT_EXIT(copy_from_host(Device::cuda(0), released, host.data(), 1), segfault, "");  // one from it
  EXPECT_EXIT(allocator(Device::cuda(0)).zero(released, sizeof(float)), segfault, "");  // the allocator's own zero
  EXPECT_EXIT(copy_on_device(Device::cuda(0), d.data(), released, page), segfault, "");  // a copy on the device
  EXPECT_EXIT(kernels::scale_in_place(Device::cuda(0), released, 4, 2.0f), segfault, "");  // a kernel
  // Its neighbours stay usable.
  kernels::scale_in_place(Device::cuda(0), d.data(), page, 2.0f);
  EXPECT_EQ(download(d.data() + page - 1, 1)[0], 2.0f);
  EXPECT_EQ(download(d.data() + 2 * page, 1)[0], 1.0f);
}

TEST(EmulatedReleasableMemory, OrdinaryMemoryCannotBeDecommitted) {
  install_emulated_cuda();
  DeviceBuffer<float> d(Device::cuda(0), 4 * page_floats());
  EXPECT_THROW(allocator(Device::cuda(0)).decommit(d.data(), d.bytes()), Error);
  EXPECT_THROW(allocator(Device::cuda(0)).commit(d.data(), d.bytes()), Error);
}

TEST(Granules, WholeGranulesEdgesAndTouchedGranulesOfARange) {
  const GranuleRange whole = whole_granules(3, 20, 8);  // bytes [3, 23) over granules of 8
  EXPECT_EQ(whole.first, 1u);
  EXPECT_EQ(whole.last, 2u);
  const std::vector<GranuleEdge> edges = granule_edges(3, 20, 8);
  ASSERT_EQ(edges.size(), 2u);
  EXPECT_EQ(edges[0].offset, 3u);
  EXPECT_EQ(edges[0].bytes, 5u);
  EXPECT_EQ(edges[0].granule, 0u);
  EXPECT_EQ(edges[1].offset, 16u);
  EXPECT_EQ(edges[1].bytes, 7u);
  EXPECT_EQ(edges[1].granule, 2u);
  EXPECT_TRUE(whole_granules(1, 8, 8).empty());  // [1, 9): across a boundary, no whole granule
  ASSERT_EQ(granule_edges(1, 8, 8).size(), 2u);
  EXPECT_EQ(granule_edges(1, 8, 8)[1].offset, 8u);
  ASSERT_EQ(granule_edges(1, 4, 8).size(), 1u);  // inside one granule
  EXPECT_EQ(granule_edges(1, 4, 8)[0].bytes, 4u);
  EXPECT_TRUE(granule_edges(8, 16, 8).empty());  // aligned: whole granules only
  const GranuleRange touched = touched_granules(3, 20, 8);
  EXPECT_EQ(touched.first, 0u);
  EXPECT_EQ(touched.last, 3u);
}

}  // namespace
}  // namespace loom::testing
