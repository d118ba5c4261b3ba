// The device-neutral entries: on the CPU the same results as kernels::cpu, bit for bit; on a GPU
// without a kernel (or without a started backend) an error naming the op.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cuda_entries.h"
#include "loom/kernels/ops.h"

namespace loom::kernels {
namespace {

TEST(Ops, CpuEntriesAreTheCpuKernels) {
  std::vector<float> in(64), a(64), b(64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.1f * static_cast<float>(i) - 3.0f;
  gelu_forward(Device::cpu(), a.data(), in.data(), 64);
  cpu::gelu_forward(b.data(), in.data(), 64);
  EXPECT_EQ(a, b);
  std::vector<float> c1(16), c2(16);
  gemm(Device::cpu(), c1.data(), in.data(), in.data() + 8, 4, 4, 2, false, true, false);
  cpu::gemm_nt(c2.data(), in.data(), in.data() + 8, 4, 4, 2, false);
  EXPECT_EQ(c1, c2);
}

TEST(Ops, CudaWithoutKernelNamesTheOp) {
  std::vector<float> x(4);
  try {
    gelu_forward(Device::cuda(0), x.data(), x.data(), 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gelu_forward"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
  }
  if (!cuda_entries().started) {
    EXPECT_THROW(rmsnorm_forward(Device::cuda(0), x.data(), x.data(), x.data(), x.data(), 1, 4, 1e-5f), Error);
  }
}

// The paged entries refuse a shape they would index the pools wrongly by, before any kernel (or
// the cache write) runs, on every device.
TEST(Ops, PagedEntriesRefuseABadShapeByName) {
  std::vector<float> pool(64), row(8);
  const std::vector<int32_t> table = {0}, zero = {0};
  for (const PagedAttentionShape& bad : {PagedAttentionShape{4, 3, 2, 4, 1}, PagedAttentionShape{4, 2, 2, 0, 1}}) {
    try {
      paged_cache_write(Device::cpu(), pool.data(), pool.data(), row.data(), row.data(), 8, table.data(), zero.data(),
                        zero.data(), 1, bad);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("paged_cache_write: heads 4, kv_heads " + std::to_string(bad.kv_heads)),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(paged_attention(Device::cpu(), row.data(), row.data(), 8, pool.data(), pool.data(), table.data(),
                                 zero.data(), zero.data(), 1, bad),
                 Error);
  }
}

}  // namespace
}  // namespace loom::kernels
