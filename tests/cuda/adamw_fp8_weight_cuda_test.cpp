// AdamW writing what the next step's products take of a per-tensor FP8 weight
// (kernels::AdamWFp8Weight, model/optimizer_weight_casts.h), on the GPU against the plain update
// and the forward's own cast of the updated weight: the parameters and moments are the plain
// update's bit for bit (and its bf16 copy, where asked), the amax is that of the updated values
// bit for bit, and the codes and scale pairs of both stores are what cast_operand_both writes from
// the updated weight under the same scale, byte for byte. Shapes whose 64 x 64 tiles cover the
// weight (the packed kernel) and shapes they do not (the scalar one, each element updated once);
// an amax alone, over the multi-tensor kernel, on a tensor of awkward length and one element in
// (not pack-aligned). Fresh random inputs, stores poisoned. Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceArray;
using testing::DeviceFloats;
using testing::random_values;

constexpr Device kCpu = Device::cpu();
const Device kGpu = Device::cuda(0);

class CudaAdamWFp8Weight : public testing::GpuTest<> {};

// One tensor's inputs on the device, twice: for the plain update and for the one writing more.
struct Update {
  int64_t n;
  std::vector<float> p, g, m, v;
  Update(uint64_t seed, int64_t n) : n(n) {
    p = random_values(seed, n, 0.5f);
    g = random_values(seed + 1, n, 0.01f);
    m = random_values(seed + 2, n, 0.001f);
    v = random_values(seed + 3, n, 1e-5f);
    for (float& x : v) x = std::fabs(x);
  }
};

constexpr AdamWStep kStep{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 11, 0.7f};

// The bits of max |x| as amax_into takes it.
uint32_t amax_bits(const std::vector<float>& x) {
  float a = 0.0f;
  kernels::amax_into(kCpu, &a, x.data(), static_cast<int64_t>(x.size()));
  return std::bit_cast<uint32_t>(a);
}

TEST_F(CudaAdamWFp8Weight, CodesAndAmaxAreTheUpdatedWeightsCastBitForBit) {
  using Shape = std::tuple<int64_t, int64_t>;
  for (const auto& [rows, cols] : {Shape{128, 192}, Shape{256, 64}, Shape{96, 80}, Shape{48, 128}}) {
    for (const bool copy : {false, true}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + (copy ? " with the bf16 copy" : ""));
      const int64_t n = rows * cols;
      const Update u(seed_ + static_cast<uint64_t>(n), n);
      DeviceFloats p1(allocator_, u.p), g(allocator_, u.g), m1(allocator_, u.m), v1(allocator_, u.v);
      DeviceFloats p2(allocator_, u.p), m2(allocator_, u.m), v2(allocator_, u.v), amax(allocator_, {0.0f});
      const int64_t forward_bytes = weight_cast_layout(OperandCast::Fp8Tensor, rows, cols).bytes;
      const int64_t transposed_bytes = weight_cast_layout(OperandCast::Fp8Tensor, cols, rows).bytes;
      DeviceArray<uint8_t> forward(allocator_, std::vector<uint8_t>(forward_bytes, 0xA5));
      DeviceArray<uint8_t> transposed(allocator_, std::vector<uint8_t>(transposed_bytes, 0xA5));
      DeviceArray<uint16_t> copy16(allocator_, std::vector<uint16_t>(n, 0xABCD));
      const float scale = 37.5f;
      adamw_update_many(kGpu, std::vector<AdamWTensor>{{p1.ptr, g.ptr, m1.ptr, v1.ptr, n}}, kStep);
      const AdamWFp8Weight fp8{amax.ptr, forward.ptr, transposed.ptr, rows, cols, scale};
      const std::vector<AdamWTensor> writing{{p2.ptr, g.ptr, m2.ptr, v2.ptr, n, copy ? copy16.ptr : nullptr, fp8}};
      adamw_update_many(kGpu, writing, kStep);
      const std::vector<float> updated = p1.host();
      EXPECT_EQ(p2.host(), updated);
      EXPECT_EQ(m2.host(), m1.host());
      EXPECT_EQ(v2.host(), v1.host());
      EXPECT_EQ(std::bit_cast<uint32_t>(amax.host()[0]), amax_bits(updated));
      if (copy) {
        std::vector<uint16_t> want(n);
        kernels::narrow_floats(kCpu, want.data(), updated.data(), n, DType::BF16);
        EXPECT_EQ(copy16.host(), want);
      }
      // The forward's cast of the updated weight: both stores from one read, under the same scale.
      DeviceFloats pair(allocator_, std::vector<float>(kFp8ScalePairFloats, 0.0f));
      fp8_tensor_scale_twice(nullptr, scale, 0, Fp8::E4M3, pair.ptr, nullptr);
      DeviceArray<uint8_t> want_forward(allocator_, std::vector<uint8_t>(forward_bytes, 0xA5));
      DeviceArray<uint8_t> want_transposed(allocator_, std::vector<uint8_t>(transposed_bytes, 0xA5));
      cast_operand_both(p1.ptr, want_forward.ptr, want_transposed.ptr, rows, cols, CastTo::E4M3, pair.ptr);
      const std::vector<uint8_t> got_forward = forward.host(), got_transposed = transposed.host();
      const std::vector<uint8_t> codes_forward = want_forward.host(), codes_transposed = want_transposed.host();
      EXPECT_EQ(std::vector<uint8_t>(got_forward.begin(), got_forward.begin() + n),
                std::vector<uint8_t>(codes_forward.begin(), codes_forward.begin() + n));
      EXPECT_EQ(std::vector<uint8_t>(got_transposed.begin(), got_transposed.begin() + n),
                std::vector<uint8_t>(codes_transposed.begin(), codes_transposed.begin() + n));
      // Each store's scale pair: the scale and its inverse, where the products read them.
      const std::vector<float> want_pair = pair.host();
      const WeightCastLayout forward_layout = weight_cast_layout(OperandCast::Fp8Tensor, rows, cols);
      const WeightCastLayout transposed_layout = weight_cast_layout(OperandCast::Fp8Tensor, cols, rows);
      for (const auto& [store, layout] :
           {std::pair{&got_forward, forward_layout}, std::pair{&got_transposed, transposed_layout}}) {
        float scale_and_inverse[kFp8ScalePairFloats];
        std::memcpy(scale_and_inverse, store->data() + layout.scale_offset, sizeof scale_and_inverse);
        EXPECT_EQ(scale_and_inverse[0], want_pair[0]);
        EXPECT_EQ(scale_and_inverse[kFp8InverseOffset], want_pair[kFp8InverseOffset]);
      }
    }
  }
}

// fp8_current's weights: the amax alone, taken by the multi-tensor kernel beside tensors without
// one (each block's max into its own tensor's float), through packs and, one element in, element
// by element. The reference is the GPU's plain update of the same inputs (the CPU's contracts its
// multiply-adds into FMAs, an ulp off on some elements: CudaKernels.AdamWEqualsTheCpuUpdate).
TEST_F(CudaAdamWFp8Weight, AnAmaxAloneIsTheUpdatedValuesMaxBitForBit) {
  for (const int64_t shift : {0, 1}) {
    for (const int64_t n : {5, 4097, 300001}) {
      SCOPED_TRACE(std::to_string(n) + " shift " + std::to_string(shift));
      const Update a(seed_ + static_cast<uint64_t>(n), n + shift), b(seed_ + 7, 1000);
      DeviceFloats pa(allocator_, a.p), ga(allocator_, a.g), ma(allocator_, a.m), va(allocator_, a.v);
      DeviceFloats pb(allocator_, b.p), gb(allocator_, b.g), mb(allocator_, b.m), vb(allocator_, b.v);
      DeviceFloats plain_p(allocator_, a.p), plain_m(allocator_, a.m), plain_v(allocator_, a.v);
      DeviceFloats amaxes(allocator_, {0.0f, 0.0f});
      AdamWTensor with{pa.ptr + shift, ga.ptr + shift, ma.ptr + shift, va.ptr + shift, n};
      with.fp8.amax = amaxes.ptr;
      adamw_update_many(kGpu, std::vector<AdamWTensor>{{pb.ptr, gb.ptr, mb.ptr, vb.ptr, 1000}, with}, kStep);
      const AdamWTensor plain{plain_p.ptr + shift, ga.ptr + shift, plain_m.ptr + shift, plain_v.ptr + shift, n};
      adamw_update_many(kGpu, std::vector<AdamWTensor>{plain}, kStep);
      const std::vector<float> want_a = plain_p.host();
      EXPECT_EQ(pa.host(), want_a);
      EXPECT_EQ(ma.host(), plain_m.host());
      EXPECT_EQ(va.host(), plain_v.host());
      const std::vector<float> updated(want_a.begin() + shift, want_a.end());
      const std::vector<float> got = amaxes.host();
      EXPECT_EQ(std::bit_cast<uint32_t>(got[0]), amax_bits(updated));
      EXPECT_EQ(got[1], 0.0f) << "the float after the amax";
    }
  }
}

// A step's whole update in one call: more FP8 weights than one launch lists (their scale pairs
// flushed in batches), mixed with plain tensors, tiles packed and scalar, with and without the
// bf16 copy, decayed and undecayed steps alternating: every tensor's parameters, amax, codes and
// scale pairs byte for byte those of a call updating it alone with its step.
TEST_F(CudaAdamWFp8Weight, ManyWeightsInOneCallAreEachUpdatedAsAlone) {
  const AdamWStep steps[2] = {kStep, AdamWStep{2e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 11, 0.7f}};
  constexpr int kTensors = 70;
  struct Piece {
    int64_t rows, cols;
    bool fp8, copy;
    std::vector<float> p;
  };
  std::vector<Piece> pieces;
  for (int i = 0; i < kTensors; ++i) {
    const bool packed = i % 3 != 0;
    pieces.push_back({packed ? 64 : 48, packed ? 128 : 80, i % 7 != 3, i % 2 == 0, {}});
  }
  // Each tensor's arrays, twice: updated together (0) and alone (1).
  struct Arrays {
    DeviceFloats p, g, m, v, amax;
    DeviceArray<uint8_t> forward, transposed;
    DeviceArray<uint16_t> copy16;
  };
  std::vector<std::unique_ptr<Arrays>> arrays[2];  // device arrays neither copy nor move
  std::vector<AdamWTensor> together, alone;
  for (int i = 0; i < kTensors; ++i) {
    const Piece& piece = pieces[i];
    const int64_t n = piece.rows * piece.cols;
    const Update u(seed_ + 100 + static_cast<uint64_t>(i), n);
    const int64_t forward_bytes = weight_cast_layout(OperandCast::Fp8Tensor, piece.rows, piece.cols).bytes;
    const int64_t transposed_bytes = weight_cast_layout(OperandCast::Fp8Tensor, piece.cols, piece.rows).bytes;
    for (int run = 0; run < 2; ++run) {
      const std::vector<uint8_t> forward(forward_bytes, 0xA5), transposed(transposed_bytes, 0xA5);
      arrays[run].emplace_back(new Arrays{DeviceFloats(allocator_, u.p), DeviceFloats(allocator_, u.g),
                                          DeviceFloats(allocator_, u.m), DeviceFloats(allocator_, u.v),
                                          DeviceFloats(allocator_, {0.0f}), DeviceArray<uint8_t>(allocator_, forward),
                                          DeviceArray<uint8_t>(allocator_, transposed),
                                          DeviceArray<uint16_t>(allocator_, std::vector<uint16_t>(n, 0xABCD))});
    }
  }
  for (int run = 0; run < 2; ++run) {
    for (int i = 0; i < kTensors; ++i) {
      const Piece& piece = pieces[i];
      Arrays& a = *arrays[run][i];
      AdamWTensor t{a.p.ptr, a.g.ptr, a.m.ptr, a.v.ptr, piece.rows * piece.cols};
      if (piece.copy) t.param_bf16 = a.copy16.ptr;
      if (piece.fp8) t.fp8 = AdamWFp8Weight{a.amax.ptr, a.forward.ptr, a.transposed.ptr, piece.rows, piece.cols,
                                            12.5f + static_cast<float>(i)};
      t.step_index = i % 2;
      (run == 0 ? together : alone).push_back(t);
    }
  }
  adamw_update_many(kGpu, together, steps);
  for (const AdamWTensor& t : alone) {
    AdamWTensor one = t;
    one.step_index = 0;
    adamw_update_many(kGpu, std::vector<AdamWTensor>{one}, steps[t.step_index]);
  }
  for (int i = 0; i < kTensors; ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    const Arrays &got = *arrays[0][i], &want = *arrays[1][i];
    EXPECT_EQ(got.p.host(), want.p.host());
    EXPECT_EQ(got.m.host(), want.m.host());
    EXPECT_EQ(got.v.host(), want.v.host());
    EXPECT_EQ(std::bit_cast<uint32_t>(got.amax.host()[0]), std::bit_cast<uint32_t>(want.amax.host()[0]));
    EXPECT_EQ(got.forward.host(), want.forward.host());
    EXPECT_EQ(got.transposed.host(), want.transposed.host());
    EXPECT_EQ(got.copy16.host(), want.copy16.host());
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
