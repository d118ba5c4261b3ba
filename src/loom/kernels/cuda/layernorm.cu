#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/norm_blocks.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/norm_math.cuh"
#include "loom/kernels/cuda/norm_rows.cuh"
#include "loom/kernels/cuda/layernorm.h"

namespace loom::kernels::cuda {

namespace {

// Chunks a thread holds: the forward's row (up to 8192 elements in packs; the weights and biases
// are read as the outputs are written, mostly from L1), the backward's row, output gradient,
// input gradient, weights and two gradients (up to 4096).
constexpr int kForwardHeld = 8, kBackwardHeld = 4;

// Rows laid out as norm_rows.cuh says, the blocks walking them grid-stride; with `amax`, max
// |output| taken too (T = Discard: the statistics and amax alone, nothing stored). Reads a row
// once (Held > 0) and writes it once: 4 + sizeof(T) bytes an element. With `add` the input rows
// are first written as a residual add's sums (AddRows; `in` is add.sum then).
template <typename T, int V, int Held>
__global__ void __launch_bounds__(kThreads, norm_forward_min_blocks(Held))
    layernorm_forward_kernel(T* out, float* mean, float* rstd, const float* in, const float* weight,
                             const float* bias, int64_t rows, int64_t dim, int group, bool whole_out, float eps,
                             unsigned* amax, AddRows add) {
  constexpr int kSlots = Held > 0 ? Held : 1;
  __shared__ float shared[kThreads / 32];
  const RowThread t = row_thread(group);
  const int64_t chunks = dim / V;
  const bool outputs = outputs_wanted<T>(amax);
  float x[kSlots][V];
  float m = 0.0f;
  // `first` is the same in every thread: all take part in every step's row sums.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * t.rows; first < rows;
       first += static_cast<int64_t>(gridDim.x) * t.rows) {
    const int64_t r = first + t.row;
    const bool valid = r < rows;
    const float* xr = in + r * dim;
    float sum = 0.0f;
    if (valid) {
      load_or_add_row<V, Held>(t, chunks, xr, add, r * dim, x);
      each_row_chunk<V, Held>(t, chunks, xr, x, [&](int k, int64_t) {
#pragma unroll
        for (int j = 0; j < V; ++j) sum += x[k][j];
      });
    }
    const float mu = layer_mean(group_sum(sum, t, shared), dim);
    float var = 0.0f;
    if (valid) {
      each_row_chunk<V, Held>(t, chunks, xr, x, [&](int k, int64_t) {
#pragma unroll
        for (int j = 0; j < V; ++j) var += (x[k][j] - mu) * (x[k][j] - mu);
      });
    }
    const float s = layer_rstd(group_sum(var, t, shared), dim, eps);
    if (!valid) continue;
    if (t.lane == 0) {
      mean[r] = mu;
      rstd[r] = s;
    }
    if (!outputs) continue;
    T* yr = out + r * dim;
    each_row_chunk<V, Held>(t, chunks, xr, x, [&](int k, int64_t c) {
      float w[V], b[V], y[V];
      load_chunk(weight, c, w);
      load_chunk(bias, c, b);
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] = layer_value(x[k][j], mu, s, w[j], b[j]);
      m = nan_max(m, store_output(yr, c, y, whole_out));
    });
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// A block per run of `block_rows` rows (a multiple of the rows side by side, norm_blocks.h), each
// row's din, and the run's weight and bias gradients left as the block's rows of `partial`
// ([blocks, dim] for the weight, then the same for the bias). Held > 0: each thread keeps its
// columns' weights and gradients in registers over the run, a row read and din written once (16
// bytes an element), the block's groups' sums then added in group order; Held = 0: a row per
// step, the gradients summed in shared memory. Either way a fixed order. din16 (null: none) gets
// din's new values rounded to bf16 (whole16: in 8-byte packs); din_amax (null: none) their max
// |value| (amax.cuh: one atomic per block).
template <int V, int Held, typename Dy>
__global__ void __launch_bounds__(kThreads, 2)
    layernorm_backward_kernel(float* din, float* partial, const Dy* dout, const float* in, const float* weight,
                              const float* mean, const float* rstd, int64_t rows, int64_t dim, int64_t block_rows,
                              int group, __nv_bfloat16* din16, bool whole16, unsigned* din_amax) {
  constexpr int kSlots = Held > 0 ? Held : 1;
  __shared__ float shared[2 * (kThreads / 32)];
  extern __shared__ float dw_sum[];  // [dim] weight, then [dim] bias
  float* db_sum = dw_sum + dim;
  const RowThread t = row_thread(group);
  const int64_t chunks = dim / V;
  float w[kSlots][V], grads[2][kSlots][V] = {};
  auto &dw = grads[0], &db = grads[1];
  start_block_gradients<V, Held, 2>(t, chunks, dim, weight, w, dw_sum);
  float m = 0.0f;  // max |din| of this thread's elements
  const int64_t first = blockIdx.x * block_rows, last = min(rows, first + block_rows);
  for (int64_t step = first; step < last; step += t.rows) {
    const int64_t r = step + t.row;
    const bool valid = r < last;
    const float* x = in + r * dim;
    const Dy* dy = dout + r * dim;
    float* dx = din + r * dim;
    float xv[kSlots][V], dyv[kSlots][V], dxv[kSlots][V];
    float sums[2] = {0.0f, 0.0f};  // of dnorm and of dnorm * xhat
    float mu = 0.0f, s = 0.0f;
    if (valid) {
      mu = mean[r];
      s = rstd[r];
      load_backward_row<V, Held>(t, chunks, x, dy, dx, xv, dyv, dxv);
      each_chunk<Held>(t, chunks, [&](int k, int64_t c) {
        load_unheld_chunk<V, Held, false>(c, x, dy, weight, dx, xv[k], dyv[k], w[k], dxv[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float dnorm = dyv[k][j] * w[k][j];
          sums[0] += dnorm;
          sums[1] += dnorm * (xv[k][j] - mu) * s;
        }
      });
    }
    group_sums(sums, t, shared);
    const float mean_dnorm = sums[0] / static_cast<float>(dim), mean_dnorm_xhat = sums[1] / static_cast<float>(dim);
    if (!valid) continue;
    each_chunk<Held>(t, chunks, [&](int k, int64_t c) {
      load_unheld_chunk<V, Held, true>(c, x, dy, weight, dx, xv[k], dyv[k], w[k], dxv[k]);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xhat = (xv[k][j] - mu) * s;
        dxv[k][j] += (dyv[k][j] * w[k][j] - mean_dnorm - xhat * mean_dnorm_xhat) * s;
        if constexpr (Held > 0) {
          dw[k][j] += dyv[k][j] * xhat;
          db[k][j] += dyv[k][j];
        } else {  // this thread's own columns
          dw_sum[c * V + j] += dyv[k][j] * xhat;
          db_sum[c * V + j] += dyv[k][j];
        }
      }
      store_chunk(dx, c, dxv[k]);
      if (din16 != nullptr) store_output(din16 + r * dim, c, dxv[k], whole16);
      if (din_amax != nullptr) m = chunk_amax(m, dxv[k]);
    });
  }
  write_block_gradients<V, Held>(t, chunks, dim, grads, dw_sum, partial);
  if (din_amax != nullptr) block_amax_into(din_amax, m);
}

template <typename T>
void launch_forward(T* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                    int64_t rows, int64_t dim, float eps, float* amax, cudaStream_t stream, AddRows add = {}) {
  if (rows == 0) return;
  // The layout from the input, weights and biases alone (and an add's rows, aligned as they are),
  // so the same for every T.
  const NormRows s = norm_rows(dim, {in, weight, bias, add.residual, add.add16}, kForwardHeld);
  const bool whole_out = pack4_aligned<T>(out);
  const auto launch = [&](auto kernel) {
    kernel<<<norm_rows_grid(rows, s, amax), kThreads, 0, stream>>>(out, mean, rstd, in, weight, bias, rows, dim,
                                                                   s.group, whole_out, eps,
                                                                   reinterpret_cast<unsigned*>(amax), add);
  };
  with_layout<kForwardHeld>(s, [&](auto v, auto held) { launch(layernorm_forward_kernel<T, v, held>); });
  check_launch("layernorm_forward_kernel");
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                       int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  launch_forward(out, mean, rstd, in, weight, bias, rows, dim, eps, nullptr, stream);
}

void layernorm_forward_bf16(void* out16, float* mean, float* rstd, const float* in, const float* weight,
                            const float* bias, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  launch_forward(static_cast<__nv_bfloat16*>(out16), mean, rstd, in, weight, bias, rows, dim, eps, nullptr, stream);
}

void layernorm_statistics(float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                          int64_t rows, int64_t dim, float eps, float* amax, cudaStream_t stream) {
  launch_forward(static_cast<Discard*>(nullptr), mean, rstd, in, weight, bias, rows, dim, eps, amax, stream);
}

void layernorm_add_forward_bf16(void* out16, float* mean, float* rstd, float* sum, const float* residual,
                                const void* add16, const float* weight, const float* bias, int64_t rows, int64_t dim,
                                float eps, cudaStream_t stream) {
  const AddRows add{residual, static_cast<const __nv_bfloat16*>(add16), sum};
  launch_forward(static_cast<__nv_bfloat16*>(out16), mean, rstd, sum, weight, bias, rows, dim, eps, nullptr, stream,
                 add);
}

namespace {
// The backward over an fp32 or bf16 (Dy) output gradient: the same layout and sums for either.
template <typename Dy>
void launch_backward(float* din, float* dweight, float* dbias, const Dy* dout, const float* in,
                     const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                     void* din16, float* din_amax, cudaStream_t stream) {
  if (rows == 0) return;
  const NormRows s = norm_rows(dim, {din, dout, in, weight}, kBackwardHeld);
  auto* din16_rows = static_cast<__nv_bfloat16*>(din16);
  const bool whole16 = pack4_aligned<__nv_bfloat16>(din16);
  const auto launch = [&](auto kernel) {
    const NormBlocks blocks = norm_blocks(rows, dim, 2, kThreads / s.group, reinterpret_cast<const void*>(kernel));
    Scratch scratch;
    float* partial = scratch.floats(2 * blocks.count * dim);
    kernel<<<static_cast<unsigned>(blocks.count), kThreads, blocks.shared_bytes, stream>>>(
        din, partial, dout, in, weight, mean, rstd, rows, dim, blocks.rows, s.group, din16_rows, whole16,
        reinterpret_cast<unsigned*>(din_amax));
    check_launch("layernorm_backward_kernel");
    add_partial_column_sums(dweight, partial, blocks.count, dim, stream);
    add_partial_column_sums(dbias, partial + blocks.count * dim, blocks.count, dim, stream);
  };
  with_layout<kBackwardHeld>(s, [&](auto v, auto held) { launch(layernorm_backward_kernel<v, held, Dy>); });
}
}  // namespace

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        void* din16, float* din_amax, cudaStream_t stream) {
  launch_backward(din, dweight, dbias, dout, in, weight, mean, rstd, rows, dim, din16, din_amax, stream);
}

void layernorm_backward_bf16(float* din, float* dweight, float* dbias, const void* dout16, const float* in,
                             const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                             void* din16, float* din_amax, cudaStream_t stream) {
  launch_backward(din, dweight, dbias, static_cast<const __nv_bfloat16*>(dout16), in, weight, mean, rstd, rows, dim,
                  din16, din_amax, stream);
}

}  // namespace loom::kernels::cuda
