#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/cross_entropy.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int32_t kIgnore = -1;  // kernels::kIgnoreIndex

// What the host reads back after a loss: the sum and the first bad target (if any), as
// (row << 32 | target bits) so one atomicMin keeps the smallest row with its own target.
constexpr unsigned long long kNoBadTarget = ~0ull;
struct LossResult {
  double total;
  unsigned long long bad;  // kNoBadTarget when every target is valid
};

__global__ void check_targets_kernel(const int32_t* targets, int64_t rows, int64_t vocab, LossResult* result) {
  for (int64_t r = grid_start(); r < rows; r += grid_stride()) {
    const int32_t t = targets[r];
    if (t != kIgnore && (t < 0 || t >= vocab)) {
      // The smallest bad row wins, so the message names the first one as the CPU's does.
      atomicMin(&result->bad, (static_cast<unsigned long long>(r) << 32) | static_cast<uint32_t>(t));
    }
  }
}

// Logits and their gradients as fp32, or as bf16 (the head's bf16 output, its gradient rounded to
// nearest even as it is stored): the arithmetic is fp32 either way (bf16_io.cuh).

// A block per row of the fused loss kernel: 1024 threads, so few rows are resident per SM and the
// gradient pass finds its row (100 KB of GPT-2's bf16 logits) still in L2: the logits come from HBM
// once and the gradient goes back once.
constexpr int kRowThreads = 1024;

// A thread's share of a row's softmax in one pass (online): its running max m and the sum s of
// exp(x - m) over its elements, rescaled when the max grows.
struct RunningSoftmax {
  float m = -INFINITY, s = 0.0f;
  __device__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  __device__ void add4(const float (&v)[4]) {
    const float top = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
    if (top > m) {
      s *= expf(m - top);
      m = top;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) s += expf(v[k] - m);
  }
};

// Packs of a row a thread loads before it adds or writes any of them (its packs p, p + blockDim.x,
// ...: each thread's own, in its order), for more bytes in flight than one load at a time; two,
// since more spill at 32 registers (two 1024-thread blocks per SM). The order of the adds, and so
// the sums, is the same whatever the count.
constexpr int kRowPacks = 2;

// The row's max and sum of exp(z - max), every thread's share combined (every thread gets both).
// Packed: the row read as aligned packs of 4 (pack4.cuh), kRowPacks in flight, else element by
// element; the fp32 and bf16 forms of a row take the same path, so the same sums.
template <bool Packed, typename T>
__device__ float2 row_softmax_stats(const T* z, int64_t vocab, float* shared) {
  RunningSoftmax run;
  if constexpr (Packed) {
    const int64_t packs = vocab / 4, stride = blockDim.x;
    for (int64_t p = threadIdx.x; p < packs; p += kRowPacks * stride) {
      Pack4<T> raw[kRowPacks];  // as stored: bf16 packs hold half the registers of their floats
#pragma unroll
      for (int j = 0; j < kRowPacks; ++j) {
        if (p + j * stride < packs) raw[j] = pack_at(z + 4 * (p + j * stride));
      }
#pragma unroll
      for (int j = 0; j < kRowPacks; ++j) {
        if (p + j * stride >= packs) break;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = load(raw[j].v, k);
        run.add4(v);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) run.add(load(z, i));
  }
  const float m = block_max(run.m, shared);
  // A thread with no elements holds s = 0 (and m = -inf): it adds 0.
  return make_float2(m, block_sum(run.s * expf(run.m - m), shared));
}

// The gradient row: factor * exp(z - m), minus grad_scale at the target (when local to this row).
template <bool Packed, typename T>
__device__ void write_gradient(T* z, int64_t vocab, float m, float sum, int64_t local, float grad_scale) {
  const float factor = grad_scale / sum;
  if constexpr (Packed) {
    // kRowPacks packs loaded before any is written back (in place: the compiler would not move a
    // load above a store that may alias it; a thread's packs are distinct, so none does).
    const int64_t packs = vocab / 4, stride = blockDim.x;
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += kRowPacks * stride) {
      Pack4<T> raw[kRowPacks];
#pragma unroll
      for (int j = 0; j < kRowPacks; ++j) {
        if (p0 + j * stride < packs) raw[j] = pack_at(z + 4 * (p0 + j * stride));
      }
#pragma unroll
      for (int j = 0; j < kRowPacks; ++j) {
        const int64_t p = p0 + j * stride;
        if (p >= packs) break;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          v[k] = factor * expf(load(raw[j].v, k) - m);
          if (4 * p + k == local) v[k] -= grad_scale;
        }
        store4(z, p, v);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      float g = factor * expf(load(z, i) - m);
      if (i == local) g -= grad_scale;
      store(z, i, g);
    }
  }
}

// An ignored target's row (this block's): loss 0 and, when a gradient is asked, a zero gradient.
template <typename T>
__device__ void ignore_row(T* z, float* losses, int64_t vocab, float grad_scale) {
  if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
  if (grad_scale != 0.0f)
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) store(z, i, 0.0f);
}

// A block of kRowThreads per row: the loss and, unless grad_scale is 0, the gradient in place.
// Two blocks per SM (at most 32 registers a thread): the rows resident together are what keeps
// HBM busy.
template <bool Packed, typename T>
__global__ void __launch_bounds__(kRowThreads, 2)
    cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int64_t vocab, float grad_scale,
                         const LossResult* result) {
  __shared__ float shared[kRowThreads / 32];
  if (result->bad != kNoBadTarget) return;  // a bad target: nothing is touched
  T* z = logits + blockIdx.x * vocab;
  const int32_t target = targets[blockIdx.x];
  if (target == kIgnore) return ignore_row(z, losses, vocab, grad_scale);
  const float2 stats = row_softmax_stats<Packed>(z, vocab, shared);
  const float m = stats.x, sum = stats.y;
  const float target_logit = load(z, target);
  __syncthreads();  // every thread has read z[target] before any overwrites it
  if (threadIdx.x == 0) losses[blockIdx.x] = static_cast<float>(log(static_cast<double>(sum)) + m - target_logit);
  if (grad_scale != 0.0f) write_gradient<Packed>(z, vocab, m, sum, target, grad_scale);
}

__global__ void row_max_kernel(const float* logits, int64_t vocab, float* row_max) {
  __shared__ float shared[kThreads / 32];
  const float* z = logits + blockIdx.x * vocab;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, z[i]);
  m = block_max(m, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void exp_sums_kernel(const float* logits, const float* row_max, const int32_t* targets, int64_t vocab,
                                int64_t first_id, float* stats) {
  __shared__ float shared[kThreads / 32];
  const float* z = logits + blockIdx.x * vocab;
  const float m = row_max[blockIdx.x];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(z[i] - m);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const int32_t t = targets[blockIdx.x];
    const int64_t local = static_cast<int64_t>(t) - first_id;
    const bool mine = t != kIgnore && local >= 0 && local < vocab;
    stats[2 * blockIdx.x] = sum;
    stats[2 * blockIdx.x + 1] = mine ? z[local] : 0.0f;
  }
}

__global__ void finish_kernel(float* logits, float* losses, const float* row_max, const float* stats,
                              const int32_t* targets, int64_t vocab, int64_t first_id, float grad_scale) {
  float* z = logits + blockIdx.x * vocab;
  const int32_t t = targets[blockIdx.x];
  if (t == kIgnore) return ignore_row(z, losses, vocab, grad_scale);
  const float m = row_max[blockIdx.x], sum = stats[2 * blockIdx.x];
  if (threadIdx.x == 0)
    losses[blockIdx.x] = static_cast<float>(log(static_cast<double>(sum)) + m - stats[2 * blockIdx.x + 1]);
  if (grad_scale != 0.0f) {
    const int64_t local = static_cast<int64_t>(t) - first_id;
    write_gradient<false>(z, vocab, m, sum, (local >= 0 && local < vocab) ? local : -1, grad_scale);
  }
}

__global__ void shard_gradient_kernel(float* logits, const float* row_max, const float* stats, const int32_t* targets,
                                      int64_t vocab, int64_t first_id, const float* row_scale) {
  float* z = logits + blockIdx.x * vocab;
  const int32_t t = targets[blockIdx.x];
  const float scale = t == kIgnore ? 0.0f : row_scale[blockIdx.x];
  if (scale == 0.0f) {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) z[i] = 0.0f;
    return;
  }
  const int64_t local = static_cast<int64_t>(t) - first_id;
  write_gradient<false>(z, vocab, row_max[blockIdx.x], stats[2 * blockIdx.x],
                        (local >= 0 && local < vocab) ? local : -1, scale);
}

// total = sum of the losses in double, deterministic (one block).
__global__ void sum_losses_kernel(const float* losses, int64_t rows, LossResult* result) {
  const double total = block_sum_in_double(losses, rows);
  if (threadIdx.x == 0) result->total = total;
}

// A small device record for one loss call, read back after the stream finishes.
class ResultSlot {
 public:
  explicit ResultSlot(cudaStream_t stream) : stream_(stream) {
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&device_), sizeof(LossResult), stream), "cudaMallocAsync");
    const LossResult init{0.0, kNoBadTarget};
    check_cuda(cudaMemcpyAsync(device_, &init, sizeof init, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  ~ResultSlot() { cudaFreeAsync(device_, stream_); }
  LossResult* device() { return device_; }
  LossResult read() {
    LossResult host{};
    check_cuda(cudaMemcpyAsync(&host, device_, sizeof host, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (cross-entropy)");
    return host;
  }

 private:
  cudaStream_t stream_;
  LossResult* device_ = nullptr;
};

}  // namespace

namespace {

template <typename T>
double cross_entropy_rows(T* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                          float grad_scale, cudaStream_t stream) {
  if (rows == 0) return 0.0;
  ResultSlot slot(stream);
  check_targets_kernel<<<grid_for(rows), kThreads, 0, stream>>>(targets, rows, vocab, slot.device());
  check_launch("check_targets_kernel");
  // Packs when every row starts on a pack: the same choice for fp32 and bf16 logits of a width.
  if (vocab % 4 == 0 && pack4_aligned<T>(logits)) {
    cross_entropy_kernel<true><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, losses, targets, vocab,
                                                                                     grad_scale, slot.device());
  } else {
    cross_entropy_kernel<false><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, losses, targets,
                                                                                      vocab, grad_scale, slot.device());
  }
  check_launch("cross_entropy_kernel");
  sum_losses_kernel<<<1, kThreads, 0, stream>>>(losses, rows, slot.device());
  check_launch("sum_losses_kernel");
  const LossResult result = slot.read();
  LOOM_CHECK(result.bad == kNoBadTarget,
             "cross-entropy: target id " + std::to_string(static_cast<int32_t>(result.bad & 0xffffffffu)) + " (row " +
                 std::to_string(result.bad >> 32) + ") is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  return result.total;
}

}  // namespace

double softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                             float grad_scale, cudaStream_t stream) {
  return cross_entropy_rows(logits, losses, targets, rows, vocab, grad_scale, stream);
}

double softmax_cross_entropy_bf16(void* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                                  float grad_scale, cudaStream_t stream) {
  return cross_entropy_rows(static_cast<__nv_bfloat16*>(logits), losses, targets, rows, vocab, grad_scale, stream);
}

void vocab_shard_row_max(const float* logits, int64_t rows, int64_t vocab_shard, float* row_max, cudaStream_t stream) {
  if (rows == 0) return;
  row_max_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab_shard, row_max);
  check_launch("row_max_kernel");
}

void vocab_shard_exp_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t rows,
                          int64_t vocab_shard, int64_t first_id, float* stats, cudaStream_t stream) {
  if (rows == 0) return;
  exp_sums_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, row_max, targets, vocab_shard,
                                                                        first_id, stats);
  check_launch("exp_sums_kernel");
}

double vocab_shard_finish(float* logits, float* losses, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          float grad_scale, cudaStream_t stream) {
  if (rows == 0) return 0.0;
  finish_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, losses, row_max, stats, targets,
                                                                      vocab_shard, first_id, grad_scale);
  check_launch("finish_kernel");
  ResultSlot slot(stream);
  sum_losses_kernel<<<1, kThreads, 0, stream>>>(losses, rows, slot.device());
  check_launch("sum_losses_kernel");
  return slot.read().total;
}

void vocab_shard_gradient(float* logits, const float* row_max, const float* stats, const int32_t* targets, int64_t rows,
                          int64_t vocab_shard, int64_t first_id, const float* row_scale, cudaStream_t stream) {
  if (rows == 0) return;
  shard_gradient_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, row_max, stats, targets,
                                                                              vocab_shard, first_id, row_scale);
  check_launch("shard_gradient_kernel");
}

}  // namespace loom::kernels::cuda
