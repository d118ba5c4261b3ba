#pragma once
// Per-tensor FP8 codes written by the kernel that produces an operand (device code): the MLP
// activation's (activation_codes.cu) and the norms' outputs (norm_codes.cu). value(r, c) computes
// element [r, c] of the operand in fp32 from what the producer reads; the tiled transposed cast
// (tiled_cast.cuh) writes its codes in both orientations from one evaluation, each followed by the
// scale and its inverse (weight_cast_layout's scale_offset: kept_operand_bytes per orientation),
// as a precision GEMM takes them (PrecisionGemm::a_codes, input_codes, a_store).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/cuda/tiled_cast.cuh"
#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {

// The scale and its inverse after each set of codes (the same offset for [rows, cols] and
// [cols, rows]); returns the first copy, which the cast reads.
inline const float* write_produced_scales(const CastOperand& cast, void* codes, void* transposed, int64_t rows,
                                          int64_t cols, cudaStream_t stream) {
  const int64_t offset = weight_cast_layout(OperandCast::Fp8Tensor, rows, cols).scale_offset;
  auto* scales = reinterpret_cast<float*>(static_cast<uint8_t*>(codes) + offset);
  auto* scales_t = reinterpret_cast<float*>(static_cast<uint8_t*>(transposed) + offset);
  fp8_tensor_scale_twice(cast.amax, cast.scale, cast.margin, cast.e5m2 ? Fp8::E5M2 : Fp8::E4M3, scales, scales_t,
                         stream);
  return scales;
}

// codes [rows, cols] and transposed [cols, rows] of value as `cast` (Fp8Tensor) says; its amax_out,
// when set, takes max |value| from the same pass (fp8_delayed).
template <typename Value>
void write_produced_codes(Value value, const CastOperand& cast, void* codes, void* transposed, int64_t rows,
                          int64_t cols, cudaStream_t stream, const char* what) {
  LOOM_CHECK(cast.cast == OperandCast::Fp8Tensor && codes != nullptr && transposed != nullptr,
             std::string(what) + ": per-tensor FP8 codes in both orientations are written");
  if (rows * cols == 0) return;
  const float* scale = write_produced_scales(cast, codes, transposed, rows, cols, stream);
  auto* t = static_cast<uint8_t*>(transposed);
  auto* plain = static_cast<uint8_t*>(codes);
  if (cast.e5m2) {
    launch_tiled_cast(value, t, plain, rows, cols, Caster<CastTo::E5M2>{scale}, stream, what, cast.amax_out);
  } else {
    launch_tiled_cast(value, t, plain, rows, cols, Caster<CastTo::E4M3>{scale}, stream, what, cast.amax_out);
  }
}

}  // namespace loom::kernels::cuda
