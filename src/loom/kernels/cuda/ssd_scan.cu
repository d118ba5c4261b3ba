#include "loom/kernels/cuda/ssd_scan.h"

#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/mamba_math.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/ssd_chunk_scan.h"
#include "loom/kernels/cuda/ssd_scan_blocks.cuh"

namespace loom::kernels::cuda {

namespace {

// Each row's blocks as segments_of_row on the CPU (cpu/ssd_scan.cpp): table[b * (seq + 1) + i] =
// begin * 2 + (1 if the block starts a document), then a last entry seq * 2; counts[b] blocks.
__global__ void ssd_segments_kernel(int32_t* __restrict__ table, int32_t* __restrict__ counts, SsdShape s,
                                    const int32_t* __restrict__ documents) {
  for (int64_t b = grid_start(); b < s.batch; b += grid_stride()) {
    const int32_t* doc = documents ? documents + b * s.seq : nullptr;
    int32_t* row = table + b * (s.seq + 1);
    int64_t begin = 0, count = 0;
    bool starts = true;
    for (int64_t t = 1; t <= s.seq; ++t) {
      const bool boundary = t < s.seq && doc && doc[t] != doc[t - 1];
      if (t == s.seq || boundary || t - begin == s.chunk) {
        row[count++] = static_cast<int32_t>(begin * 2 + (starts ? 1 : 0));
        begin = t;
        starts = boundary;
      }
    }
    row[count] = static_cast<int32_t>(s.seq * 2);
    counts[b] = static_cast<int32_t>(count);
  }
}

// Per (row, group, token): its block's C_t . B_j, j from the block's start up to t (block_cb on
// the CPU, per group).
__global__ void ssd_dots_kernel(double* dots, ScanInputs in, SsdShape s, const int32_t* __restrict__ table,
                                const int32_t* __restrict__ counts) {
  for (int64_t r = blockIdx.y; r < s.batch * s.groups * s.seq; r += gridDim.y) {
    const int64_t b = r / (s.groups * s.seq), g = (r / s.seq) % s.groups, t = r % s.seq;
    // t's block: the last whose start is at most t.
    const int32_t* row = table + b * (s.seq + 1);
    int32_t lo = 0, hi = counts[b] - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (row[mid] / 2 <= t) lo = mid;
      else hi = mid - 1;
    }
    const int64_t begin = row[lo] / 2;
    const float* Ct = in.C + (b * s.seq + t) * s.bc_stride + g * s.state;
    const float* B = in.B + (b * s.seq + begin) * s.bc_stride + g * s.state;
    double* out = dots + r * longest_block(s);
    for (int64_t j = column_start(); j <= t - begin; j += column_stride())
      out[j] = dot(Ct, B + j * s.bc_stride, s.state);
  }
}

// y over the block from the entering state S and the block's own tokens (block_output on the CPU).
__device__ void block_output(const HeadScan& hs, const Segment& seg, float* y, const double* dots) {
  const SsdShape& s = hs.s;
  const int64_t len = seg.len(), P = s.head_dim, N = s.state;
  const int64_t b = hs.row0 / s.seq;
  for (int64_t k = threadIdx.x; k < len * len; k += blockDim.x) {
    const int64_t i = k / len, j = k % len;
    if (j > i) continue;
    hs.W[i * len + j] = exp(hs.cum[i] - hs.cum[j]) * hs.dt[j] * dots_row(dots, s, b, hs.g, seg.begin + i)[j];
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < len * P; k += blockDim.x) {
    const int64_t i = k / P, p = k % P;
    const float* Ci = hs.C_at(seg.begin + i);
    double sc = 0.0;
    for (int64_t n = 0; n < N; ++n) sc += hs.S[p * N + n] * Ci[n];
    double acc = hs.D * hs.x_at(seg.begin + i)[p] + exp(hs.cum[i]) * sc;
    for (int64_t j = 0; j <= i; ++j) acc += hs.W[i * len + j] * hs.x_at(seg.begin + j)[p];
    y[(hs.row0 + seg.begin + i) * s.y_stride + hs.h * P + p] = static_cast<float>(acc);
  }
  __syncthreads();
}

// S <- exp(cum_end) S + sum_j exp(cum_end - cum_j) dt_j x_j B_j^T (advance_state on the CPU).
__device__ void advance_state(const HeadScan& hs, const Segment& seg) {
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  const double last = hs.cum[len - 1];
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) hs.coef[j] = exp(last - hs.cum[j]) * hs.dt[j];
  __syncthreads();
  const double keep = exp(last);
  for (int64_t k = threadIdx.x; k < P * N; k += blockDim.x) {
    const int64_t p = k / N, n = k % N;
    double v = keep * hs.S[k];
    for (int64_t j = 0; j < len; ++j) v += hs.coef[j] * hs.x_at(seg.begin + j)[p] * hs.B_at(seg.begin + j)[n];
    hs.S[k] = v;
  }
  __syncthreads();
}

// One thread block per (row, head): y (when given, with block_dots' array), or the entering state of
// every block that does not start a document (when `entering` is given: the backward's
// recomputation), in slots; from and to the carried states when given (the row's first block then
// continues the initial state instead of starting a document).
__global__ void ssd_forward_kernel(float* y, const double* dots, double* entering, int64_t slots, ScanInputs in,
                                   SsdShape s, const int32_t* __restrict__ table, const int32_t* __restrict__ counts,
                                   double* work, CarriedState carried) {
  const int64_t b = blockIdx.x / s.heads, h = blockIdx.x % s.heads, size = s.head_dim * s.state;
  HeadScan hs = head_scan(in, s, b, h, work + blockIdx.x * forward_work(s));
  const float* initial = carried.initial ? carried.initial + blockIdx.x * size : nullptr;
  for (int64_t k = threadIdx.x; k < size; k += blockDim.x) hs.S[k] = initial ? initial[k] : 0.0;
  int64_t slot = 0;
  for (int32_t i = 0; i < counts[b]; ++i) {
    const Segment seg = segment_at(table, s, b, i);
    const bool restart = seg.starts_document && !(initial && seg.begin == 0);
    double* saved = entering ? entering + ((b * s.heads + h) * slots + slot) * size : nullptr;
    for (int64_t k = threadIdx.x; k < size; k += blockDim.x) {
      if (restart) hs.S[k] = 0.0;
      else if (saved) saved[k] = hs.S[k];
    }
    if (!restart) ++slot;
    load_block(hs, seg);
    if (y) block_output(hs, seg, y, dots);
    advance_state(hs, seg);
  }
  if (carried.final) {
    float* final = carried.final + blockIdx.x * size;
    for (int64_t k = threadIdx.x; k < size; k += blockDim.x) final[k] = static_cast<float>(hs.S[k]);
  }
}

__global__ void ssd_step_kernel(float* __restrict__ y, float* __restrict__ state, const int32_t* __restrict__ slots,
                                ScanInputs in, SsdShape s) {
  const int64_t P = s.head_dim, N = s.state, per_group = s.heads / s.groups;
  for (int64_t k = grid_start(); k < s.batch * s.heads * P; k += grid_stride()) {
    const int64_t b = k / (s.heads * P), h = (k / P) % s.heads, p = k % P, g = h / per_group;
    const double dt = softplus_of(static_cast<double>(in.dt_raw[b * s.dt_stride + h]) + in.dt_bias[h]);
    const double decay = exp(-exp(static_cast<double>(in.A_log[h])) * dt);
    const double xp = in.x[b * s.x_stride + h * P + p];
    const float* Bg = in.B + b * s.bc_stride + g * N;
    const float* Cg = in.C + b * s.bc_stride + g * N;
    float* S = state + (((slots ? slots[b] : b) * s.heads + h) * P + p) * N;
    double acc = static_cast<double>(in.D[h]) * xp;
    for (int64_t n = 0; n < N; ++n) {
      const double v = decay * S[n] + dt * xp * Bg[n];
      S[n] = static_cast<float>(v);
      acc += v * Cg[n];
    }
    y[b * s.y_stride + h * P + p] = static_cast<float>(acc);
  }
}

}  // namespace

RowSegments row_segments(const SsdShape& s, const int32_t* documents, Scratch& scratch, cudaStream_t stream) {
  // segment_ints(s) in all (kernels/ssd_scan_work.h)
  RowSegments out{scratch.of<int32_t>(s.batch * (s.seq + 1)), scratch.of<int32_t>(s.batch)};
  ssd_segments_kernel<<<grid_for(s.batch), kThreads, 0, stream>>>(out.table, out.counts, s, documents);
  check_launch("ssd_segments_kernel");
  return out;
}

double* block_dots(const ScanInputs& in, const SsdShape& s, const RowSegments& segments, Scratch& scratch,
                   cudaStream_t stream) {
  double* dots = scratch.of<double>(block_dot_doubles(s));
  const RowsLaunch l = launch_over_rows(s.batch * s.groups * s.seq, longest_block(s));
  ssd_dots_kernel<<<l.grid, l.block, 0, stream>>>(dots, in, s, segments.table, segments.counts);
  check_launch("ssd_dots_kernel");
  return dots;
}

void scan_states(float* y, double* entering, int64_t slots, const ScanInputs& in, const SsdShape& s,
                 const RowSegments& segments, Scratch& scratch, cudaStream_t stream, CarriedState carried) {
  const double* dots = y ? block_dots(in, s, segments, scratch, stream) : nullptr;
  double* work = scratch.of<double>(forward_work_doubles(s));
  ssd_forward_kernel<<<static_cast<unsigned>(s.batch * s.heads), kThreads, 0, stream>>>(
      y, dots, entering, slots, in, s, segments.table, segments.counts, work, carried);
  check_launch("ssd_forward_kernel");
}

void ssd_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                      const float* B, const float* C, const float* D, const SsdShape& s, const int32_t* documents,
                      cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  if (ssd_scan_in_chunks())
    return ssd_chunk_scan_forward(y, x, dt_raw, dt_bias, A_log, B, C, D, s, documents, stream);
  Scratch scratch;
  const RowSegments segments = row_segments(s, documents, scratch, stream);
  scan_states(y, nullptr, 0, {x, dt_raw, dt_bias, A_log, B, C, D}, s, segments, scratch, stream);
}

void ssd_scan_step(float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                   const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                   const SsdShape& s, cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  if (s.seq > 1) {  // a prompt's chunk: the chunked scan, continuing from the state and back into it
    if (ssd_scan_in_chunks())
      return ssd_chunk_scan_continue(y, state, x, dt_raw, dt_bias, A_log, B, C, D, s, stream);
    Scratch scratch;
    const RowSegments segments = row_segments(s, nullptr, scratch, stream);
    scan_states(y, nullptr, 0, {x, dt_raw, dt_bias, A_log, B, C, D}, s, segments, scratch, stream, {state, state});
    return;
  }
  const int64_t n = s.batch * s.heads * s.head_dim;
  if (n == 0) return;
  ssd_step_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, state, slots, {x, dt_raw, dt_bias, A_log, B, C, D}, s);
  check_launch("ssd_step_kernel");
}

}  // namespace loom::kernels::cuda
