#pragma once
// MXFP8 as the OCP Microscaling Formats (MX) Specification v1.0 defines it: blocks of k = 32
// elements share one scale X of type E8M0; element i holds P_i in FP8 (E4M3 or E5M2) and means
// X * P_i. Blackwell tensor cores multiply such operands directly; this is the CPU reference.
//
// Conversion (spec section 6.3, closed form of the companion paper's Algorithm 1):
//   shared_exp = floor(log2(max_i |V_i|)) - emax_elem      emax_elem = 8 (E4M3), 15 (E5M2)
//   X          = 2^shared_exp
//   P_i        = quantize_to_element_format(V_i / X)       round to nearest even; normal values
//                                                          past the max normal clamp to it, sign kept
// Because X is a power of two, V_i / X and X * P_i are exact in fp32: the only rounding is the
// element cast. The floor puts the block maximum in [2^emax, 2^(emax+1)), so E4M3 blocks whose
// largest mantissa exceeds 1.75 (beyond 448) saturate; that is what the spec prescribes.
// (TransformerEngine's MXFP8 kernels round the exponent up instead and never saturate; loom follows
// the spec.)
//
// E8M0: 8 exponent bits, bias 127, value 2^(bits - 127), no sign, no zero, no Inf; 0xFF is NaN.
// Decisions where the spec leaves room (as the spec authors' reference emulation, microxcaling):
// - shared_exp below -127 (amax < 2^-119 for E4M3, including an all-zero block) clamps to -127:
//   X = 2^-127, and the elements are whatever survives the cast (zeros stay zeros, signs kept).
// - A block containing NaN or Inf gets X = NaN (0xFF): floor(log2(Inf)) overflows E8M0, and by the
//   spec a NaN scale makes every element of the block NaN whatever P_i holds. The elements are
//   then set to the element NaN code too, so a reader ignoring the scale also sees NaN.
// - A finite fp32 amax never overflows E8M0 (floor(log2) <= 127, minus emax_elem > 0).
#include <array>
#include <cstdint>

#include "loom/precision/formats.h"

namespace loom::precision {

constexpr int kMxBlockSize = 32;
constexpr uint8_t kE8M0Nan = 0xff;
constexpr int kE8M0Bias = 127;

// 2^(bits - 127); 0xFF -> NaN. bits 0 is 2^-127, an fp32 subnormal (exact).
float e8m0_to_float(uint8_t bits);
// E8M0 bits of the scale the spec picks for a block with this amax (0xFF for NaN/Inf amax).
uint8_t mx_scale_bits(float block_amax, Fp8Format format);

struct MxBlock {
  uint8_t scale_bits = 0;  // E8M0
  int count = 0;           // elements used, 1..32
  std::array<uint8_t, kMxBlockSize> elements{};
};

// One block of count (1..32) values; a short block is a ragged tail, scaled by its own amax.
MxBlock encode_mx_block(const float* v, int count, Fp8Format format);
// out[i] = X * P_i for i < block.count (all NaN when X is NaN).
void decode_mx_block(const MxBlock& block, Fp8Format format, float* out);

// Row-major [rows, cols] with blocks of 32 along each row (the reduction dimension K of a
// row-major [M, K] GEMM operand; the last block of a row may be shorter):
// codes [rows * cols], scales [rows * ceil(cols / 32)].
void encode_mx(const float* data, int64_t rows, int64_t cols, Fp8Format format, uint8_t* codes, uint8_t* scales);
void decode_mx(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8Format format,
               float* out);
// In place: data = decode(encode(data)), blocks along rows as above.
void quantize_dequantize_mx(float* data, int64_t rows, int64_t cols, Fp8Format format);

// In place, blocks of 32 down each column: for a row-major [K, N] operand whose reduction
// dimension K runs along the rows (a backward GEMM operand used transposed). Same result as transposing, quantize_dequantize_mx, transposing back. Note MX conversion
// does not commute with transposition: a tensor used along both dimensions needs both copies.
void quantize_dequantize_mx_columns(float* data, int64_t rows, int64_t cols, Fp8Format format);

}  // namespace loom::precision
