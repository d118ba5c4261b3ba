#pragma once
// The precision recipes' device entries (kernels/ops.h: amax, round_in_place,
// precision_linear_gemm) on the emulated CUDA device (emulated_cuda.h). They have no CPU kernel:
// the CPU emulates the recipes in the model layer (model/linear_precision.cpp). These compute
// what that emulation computes, bit for bit, from what a GPU is handed: each operand quantized
// and dequantized in fp32 as its cast says (the scale from the device amax under fp8_current),
// the fp32 product through the same CPU kernel calls, the result rounded to the recipe's dtype.
// An Inf or NaN element of an FP8 operand becomes NaN first, as the device's casts write it
// (kernels/precision_gemm.h), where the CPU passes such an operand on unquantized. A weight's
// cast kept in a store (CastStore) is kept beside it here, by the store's address: a Read
// multiplies what the last Write to that store cast, whatever b.data holds now, as a GPU would.
// Test support.
#include <cstdint>

#include "loom/core/device.h"
#include "loom/kernels/precision_gemm.h"
#include "loom/kernels/types.h"

namespace loom::testing {

float emulated_amax(Device device, const float* x, int64_t n);
void emulated_round_in_place(Device device, float* x, int64_t n, kernels::OutputRounding rounding);
void emulated_precision_linear_gemm(Device device, const kernels::PrecisionGemm& gemm);
// kernels::activation_forward_codes / activation_backward_codes: the CPU's activation (or its
// gradient) in fp32 from the same bf16 tensors, cast as `cast` says; the codes kept here by their
// addresses, for the GEMMs that multiply them (a_codes, input_codes, a_store).
void emulated_activation_forward_codes(Device device, kernels::MlpActivation activation, const void* in16,
                                       int64_t rows, int64_t width, const kernels::CastOperand& cast, void* codes,
                                       void* transposed);
void emulated_activation_backward_codes(Device device, kernels::MlpActivation activation, const void* dout16,
                                        const void* in16, int64_t rows, int64_t width,
                                        const kernels::CastOperand& cast, void* codes, void* transposed);
// kernels::norm_statistics / norm_forward_codes: the CPU's norm forward (statistics, and its
// outputs' amax), and the codes of its outputs cast as `cast` says, kept as the activation's are.
void emulated_norm_statistics(Device device, float* mean, float* rstd, const float* in, const float* weight,
                              const float* bias, int64_t rows, int64_t dim, float eps, float* amax);
void emulated_norm_forward_codes(Device device, const float* in, const float* weight, const float* bias,
                                 const float* mean, const float* rstd, int64_t rows, int64_t dim,
                                 const kernels::CastOperand& cast, void* codes, void* transposed);

// The stores an FP8 weight's update writes (kernels::AdamWFp8Weight: device pointers) from its
// updated `values` (host memory): kept as the forward's and dgrad's casts of the weight would be,
// and marked as the optimizer's, so a GEMM reading them checks they still hold the weight's values
// (a stale store is an Error).
void emulated_keep_optimizer_codes(const kernels::AdamWFp8Weight& weight, const float* values);

// Counts of the weight casts of the forward and dgrad GEMMs since the last reset, over every
// thread: `cast` the weights cast (uncached, or written to a store), `reused` those read from one.
struct WeightCastCounts {
  int64_t cast = 0, reused = 0;
};
WeightCastCounts emulated_weight_cast_counts();
void reset_emulated_weight_cast_counts();
// How many weight-gradient GEMMs multiplied the output gradient's cast their layer's dgrad kept
// (PrecisionGemm::a_store: a 16-bit copy or per-tensor FP8 codes), over every thread since the
// process started.
int64_t emulated_output_grad_reuses();
// How many weight-gradient GEMMs multiplied the FP8 input codes their layer's forward kept
// (PrecisionGemm::input_codes), over every thread since the process started.
int64_t emulated_input_code_reuses();

}  // namespace loom::testing
