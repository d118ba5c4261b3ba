// The device-neutral entries: on the CPU the same results as kernels::cpu, bit for bit; on a GPU
// without a kernel (or without a started backend) an error naming the op.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace loom::kernels
