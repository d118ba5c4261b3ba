// The emulated CUDA device of the tests (tests/support/emulated_cuda.h): its memory cannot be
// read from the host, host memory cannot be handed to its ops, and its ops compute the CPU's
// results bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/device.h"
#include "loom/kernels/cuda_entries.h"
#include "loom/kernels/ops.h"
#include "support/emulated_cuda.h"
#ifdef LOOM_TEST_REAL_CUDA_ENTRIES
#include "loom/kernels/cuda/entries.h"
#endif

namespace loom::testing {
namespace {

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<float>((i * 37) % 101 - 50);
  return v;
}

DeviceBuffer<float> upload(const std::vector<float>& host) {
  DeviceBuffer<float> d(Device::cuda(0), static_cast<int64_t>(host.size()));
  copy_from_host(Device::cuda(0), d.data(), host.data(), d.size());
  return d;
}

std::vector<float> download(const DeviceBuffer<float>& d) {
  std::vector<float> host(static_cast<size_t>(d.size()));
  copy_to_host(d.device(), host.data(), d.data(), d.size());
  return host;
}

TEST(EmulatedCudaDeathTest, HostDereferenceOfDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  install_emulated_cuda();
  DeviceBuffer<float> d(Device::cuda(0), 16);
  ASSERT_TRUE(is_emulated_device_pointer(d.data()));
  volatile float* p = d.data();
  EXPECT_DEATH({ p[3] = 1.0f; }, "");
  EXPECT_DEATH({ [[maybe_unused]] float x = p[0]; }, "");
}

TEST(EmulatedCuda, HostPointerToADeviceOpIsAnErrorNamingTheOp) {
  install_emulated_cuda();
  std::vector<float> host(8);
  DeviceBuffer<float> d(Device::cuda(0), 8);
  try {
    kernels::gelu_forward(Device::cuda(0), d.data(), host.data(), 8);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gelu_forward"), std::string::npos) << what;
    EXPECT_NE(what.find("argument 2"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
  }
}

TEST(EmulatedCuda, OpsEqualTheCpuBitForBit) {
  install_emulated_cuda();
  const int64_t rows = 6, dim = 40;
  const std::vector<float> x = ramp(rows * dim, 0.013f), w = ramp(dim, 0.02f), dout = ramp(rows * dim, 0.007f);
  // RMSNorm forward and backward, and a GEMM, on the CPU ...
  std::vector<float> out(x.size()), rstd(rows), din(x.size(), 0.5f), dw(dim, 0.25f), c(rows * rows);
  kernels::rmsnorm_forward(Device::cpu(), out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
  kernels::rmsnorm_backward(Device::cpu(), din.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows,
                            dim);
  kernels::gemm(Device::cpu(), c.data(), x.data(), out.data(), rows, rows, dim, false, true, false);
  // ... and on the emulated device.
  const Device g = Device::cuda(0);
  DeviceBuffer<float> dx = upload(x), dwt = upload(w), ddout = upload(dout), dout_n(g, rows * dim), drstd(g, rows);
  DeviceBuffer<float> ddin = upload(std::vector<float>(x.size(), 0.5f)), ddw = upload(std::vector<float>(dim, 0.25f));
  DeviceBuffer<float> dc(g, rows * rows);
  kernels::rmsnorm_forward(g, dout_n.data(), drstd.data(), dx.data(), dwt.data(), rows, dim, 1e-5f);
  kernels::rmsnorm_backward(g, ddin.data(), ddw.data(), ddout.data(), dx.data(), dwt.data(), drstd.data(), rows, dim);
  kernels::gemm(g, dc.data(), dx.data(), dout_n.data(), rows, rows, dim, false, true, false);
  EXPECT_EQ(download(dout_n), out);
  EXPECT_EQ(download(drstd), rstd);
  EXPECT_EQ(download(ddin), din);
  EXPECT_EQ(download(ddw), dw);
  EXPECT_EQ(download(dc), c);
  EXPECT_EQ(kernels::sum_of_squares(g, dx.data(), dx.size()), kernels::sum_of_squares(Device::cpu(), x.data(), rows * dim));
}

TEST(EmulatedCuda, AdamWManyUntagsTheTensorsItIsGiven) {
  install_emulated_cuda();
  const std::vector<float> p = ramp(50, 0.01f), grad = ramp(50, 0.003f);
  std::vector<float> hp = p, hm(50, 0.0f), hv(50, 0.0f);
  const kernels::AdamWStep step{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5f};
  kernels::adamw_update(Device::cpu(), hp.data(), grad.data(), hm.data(), hv.data(), 50, step);
  DeviceBuffer<float> dp = upload(p), dg = upload(grad), dm(Device::cuda(0), 50), dv(Device::cuda(0), 50);
  const std::vector<kernels::AdamWTensor> tensors = {{dp.data(), dg.data(), dm.data(), dv.data(), 20},
                                                     {dp.data() + 20, dg.data() + 20, dm.data() + 20, dv.data() + 20, 30}};
  kernels::adamw_update_many(Device::cuda(0), tensors, step);
  EXPECT_EQ(download(dp), hp);
  EXPECT_EQ(download(dm), hm);
  EXPECT_EQ(download(dv), hv);
}

TEST(EmulatedCuda, TransfersKeepHostAndDeviceApart) {
  install_emulated_cuda();
  std::vector<float> host = ramp(10, 1.0f);
  DeviceBuffer<float> d = upload(host), e(Device::cuda(1), 10);
  EXPECT_THROW(copy_from_host(Device::cuda(0), d.data(), e.data(), 10), Error);  // device source
  EXPECT_THROW(copy_to_host(Device::cuda(0), e.data(), d.data(), 10), Error);    // device destination
  EXPECT_THROW(copy_on_device(Device::cuda(0), d.data(), host.data(), 10), Error);
  DeviceBuffer<float> copy = d;  // a deep copy on the device
  EXPECT_EQ(download(copy), host);
}

// A transfer not waited for runs when its queue next works or a fence of it is waited for, as a
// GPU's copy engine may run it any time until then: the host side read (or rewritten) before the
// fence shows the old bytes (or sends the new ones), which the offloaded optimizer's bit-for-bit
// tests rely on to catch a missing wait. Only transfer staging takes part.
TEST(EmulatedCuda, TransfersNotWaitedForLandAtTheirFence) {
  install_emulated_cuda();
  Allocator& device = allocator(Device::cuda(0));
  const std::vector<float> values = ramp(8, 1.0f);
  DeviceBuffer<float> d = upload(values);
  auto* staging = static_cast<float*>(device.allocate_transfer_staging(8 * sizeof(float)));
  std::fill(staging, staging + 8, -1.0f);
  device.to_host_async(staging, d.data(), 4 * sizeof(float));
  const std::unique_ptr<DeviceFence> first = device.fence();
  device.to_host_async(staging + 4, d.data() + 4, 4 * sizeof(float));
  EXPECT_EQ(staging[0], -1.0f) << "not yet";
  first->wait();
  EXPECT_TRUE(std::equal(values.begin(), values.begin() + 4, staging));
  EXPECT_EQ(staging[4], -1.0f) << "issued after the fence waited for";
  device.fence()->wait();
  EXPECT_TRUE(std::equal(values.begin(), values.end(), staging));

  std::fill(staging, staging + 8, 5.0f);
  device.from_host_async(d.data(), staging, 8 * sizeof(float));
  std::fill(staging, staging + 8, 7.0f);  // rewritten before the fence: these are what arrive
  EXPECT_EQ(download(d), std::vector<float>(8, 7.0f)) << "the next operation ran it first";

  std::vector<float> pageable(8);
  EXPECT_THROW(device.to_host_async(pageable.data(), d.data(), 8 * sizeof(float)), Error);
  device.free_transfer_staging(staging, 8 * sizeof(float));
}

#ifdef LOOM_TEST_REAL_CUDA_ENTRIES
// The emulated device serves exactly the ops the real backend has kernels for (the precision
// recipes' device-only entries by the CPU's emulation of the recipes): an op without a CUDA kernel
// fails in CI as it would on a GPU.
TEST(EmulatedCuda, ServesExactlyTheRealBackendsOps) {
  install_emulated_cuda();
  kernels::CudaEntries real;
  kernels::cuda::register_kernels(real);
  const kernels::CudaEntries& emulated = kernels::cuda_entries();
  constexpr size_t slots = offsetof(kernels::CudaEntries, started) / sizeof(void*);
  for (size_t i = 0; i < slots; ++i) {
    void* a = nullptr;
    void* b = nullptr;
    std::memcpy(&a, reinterpret_cast<const char*>(&real) + i * sizeof(void*), sizeof a);
    std::memcpy(&b, reinterpret_cast<const char*>(&emulated) + i * sizeof(void*), sizeof b);
    EXPECT_EQ(a != nullptr, b != nullptr) << "entry " << i << " of kernels::CudaEntries";
  }
}
#endif

}  // namespace
}  // namespace loom::testing
