// The device layer: Device names, the host allocator's accounting, DeviceBuffer's vector-like
// semantics, and a clear error for a device with no allocator.
#include <gtest/gtest.h>

#include "loom/core/device.h"

namespace loom {
namespace {

TEST(Device, NamesAndKinds) {
  EXPECT_EQ(Device::cpu().name(), "cpu");
  EXPECT_EQ(Device::cuda(3).name(), "cuda:3");
  EXPECT_TRUE(Device{}.is_cpu());
  EXPECT_NE(Device::cuda(0), Device::cpu());
}

TEST(DeviceBuffer, GrowsKeepingContentsAndCountsBytes) {
  Allocator& host = allocator(Device::cpu());
  EXPECT_EQ(host.alignment(), 64u);
  const int64_t before = host.bytes_in_use();
  {
    DeviceBuffer<float> b(Device::cpu(), 4);
    EXPECT_EQ(host.bytes_in_use() - before, 16);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.data()[i], 0.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    for (int i = 0; i < 4; ++i) b.data()[i] = static_cast<float>(i + 1);
    b.resize(8);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.data()[i], static_cast<float>(i + 1));
    for (int i = 4; i < 8; ++i) EXPECT_EQ(b.data()[i], 0.0f);
    DeviceBuffer<float> copy = b;
    EXPECT_NE(copy.data(), b.data());
    EXPECT_EQ(copy.data()[3], 4.0f);
    EXPECT_GE(host.peak_bytes() - before, 64);
    b.release();
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(b.data(), nullptr);
  }
  EXPECT_EQ(host.bytes_in_use(), before);
}

// On the host, decommitted pages go back to the system and read as zero (a write fault brings
// them back, so commit has nothing to do); the range's ends, on pages shared with neighbouring
// data, are zeroed; the data around the range is kept.
TEST(DeviceBuffer, HostReleasableMemoryReadsZeroWhenDecommittedAndTakesWritesAgain) {
  Allocator& host = allocator(Device::cpu());
  DeviceBuffer<float> b = DeviceBuffer<float>::releasable(Device::cpu(), 1 << 16);  // 256 KiB
  for (int64_t i = 0; i < b.size(); ++i) b.data()[i] = 1.0f;
  const int64_t from = 1000, count = 50000;
  host.decommit(b.data() + from, static_cast<size_t>(count) * sizeof(float));
  for (int64_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(b.data()[i], i >= from && i < from + count ? 0.0f : 1.0f) << i;
  }
  host.commit(b.data() + from, static_cast<size_t>(count) * sizeof(float));
  b.data()[from + count / 2] = 3.0f;
  EXPECT_EQ(b.data()[from + count / 2], 3.0f);
  b.resize(8);  // keeps the first elements
  EXPECT_EQ(b.data()[0], 1.0f);
}

TEST(DeviceBuffer, DeviceWithoutAllocatorIsAnErrorNamingIt) {
  try {
    DeviceBuffer<float> b(Device::cuda(15), 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:15"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
