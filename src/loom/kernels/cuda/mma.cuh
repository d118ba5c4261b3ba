#pragma once
// Tensor-core building blocks (sm_80+ warp-level instructions, device code only): 16-byte
// asynchronous copies into shared memory, ldmatrix, and the bf16 mma.sync m16n8k16 with fp32
// accumulation. Fragment layouts (PTX ISA, "mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same cols),
//                           a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9);
//   B (16 x 8, k x n):      b0 (k 2t, 2t+1; n g), b1 (k 2t+8, 2t+9; n g);
//   C (16 x 8, fp32):       c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same cols).
// Each 32-bit register holds two bf16, the lower column (or k) in the low half.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda::mma {

__device__ inline unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory without passing through registers; `valid` false fills
// the 16 bytes with zeros and reads nothing.
__device__ inline void copy16_async(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ inline void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void copies_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Every committed group but the most recent one has landed (the one before it is usable).
__device__ inline void copies_wait_all_but_last() { asm volatile("cp.async.wait_group 1;\n" ::); }

// Four 8 x 8 bf16 matrices; lanes 8i .. 8i+7 give the row addresses of matrix i, and every lane
// receives (row g, cols 2t, 2t+1) of matrix i in r[i] (transposed: (rows 2t, 2t+1, col g)).
__device__ inline void load_matrices(unsigned (&r)[4], const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ inline void load_matrices_transposed(unsigned (&r)[4], const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// d += a . b (16 x 16 by 16 x 8, fp32 accumulators).
__device__ inline void multiply_add(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x in one special-function instruction (relative error about 2^-22; subnormal results flush to
// 0, and 2^-inf = +0): what a softmax rounded to bf16 needs, without exp2f's range handling.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline unsigned pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// The A fragment (16 x 16) at (row0, col0) of a row-major bf16 tile with `stride` elements per
// row (rows 16-byte aligned).
__device__ inline void load_a(unsigned (&a)[4], const __nv_bfloat16* tile, int stride, int row0, int col0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8, r = lane % 8;
  load_matrices(a, tile + (row0 + r + (matrix % 2) * 8) * stride + col0 + (matrix / 2) * 8);
}
// B fragments of two n-tiles (n0 .. n0+15) at k0 .. k0+15, from a tile stored [n][k] (k
// contiguous): b[0], b[1] for n0, b[2], b[3] for n0 + 8.
__device__ inline void load_b_nk(unsigned (&b)[4], const __nv_bfloat16* tile, int stride, int n0, int k0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8, r = lane % 8;
  load_matrices(b, tile + (n0 + r + (matrix / 2) * 8) * stride + k0 + (matrix % 2) * 8);
}
// The same from a tile stored [k][n] (n contiguous), through the transposing load.
__device__ inline void load_b_kn(unsigned (&b)[4], const __nv_bfloat16* tile, int stride, int n0, int k0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8, r = lane % 8;
  load_matrices_transposed(b, tile + (k0 + r + (matrix % 2) * 8) * stride + n0 + (matrix / 2) * 8);
}

// The A fragment of k-step kk from fp32 C fragments of n-tiles 2kk and 2kk+1 (the C layout of a
// 16 x 16 product is the A layout of the next one), rounded to bf16.
__device__ inline void c_to_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

}  // namespace loom::kernels::cuda::mma
