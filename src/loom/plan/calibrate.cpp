#include "loom/plan/calibrate.h"

#include <cblas.h>
#include <omp.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "loom/comm/comm_bench.h"
#include "loom/comm/launch.h"
#include "loom/kernels/ops.h"
#include "loom/model/flops.h"
#include "loom/core/release_pages.h"
#include "loom/precision/formats.h"
#include "loom/precision/fp8_scaling.h"

namespace loom::plan {

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double median_seconds(int repeats, F f) {
  f();  // warm-up: first-touch pages and library buffers
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    f();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double gemm_flops(int64_t m, int64_t n, int64_t k, int repeats) {
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(n * k), 0.25f),
      c(static_cast<size_t>(m * n));
  const double s = median_seconds(repeats, [&] { kernels::gemm_nt(Device::cpu(), c.data(), a.data(), b.data(), m, n, k, false); });
  return 2.0 * static_cast<double>(m) * n * k / s;
}

// Cores the host gives us now: every core runs its own one-thread GEMM at once; the aggregate
// rate over one thread's (other work on a shared host makes this fractional).
double effective_cores(double single_rate, int repeats) {
  const int threads = omp_get_num_procs();
  const int64_t n = 1024;
  std::vector<std::vector<float>> a(threads, std::vector<float>(n * n, 0.5f)), c(threads, std::vector<float>(n * n));
  const double s = median_seconds(repeats, [&] {
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      kernels::gemm_nt(Device::cpu(), c[t].data(), a[t].data(), a[t].data(), n, n, n, false);
    }
  });
  const double aggregate = threads * 2.0 * n * n * n / s;
  return std::clamp(aggregate / single_rate, 0.01, static_cast<double>(threads));
}

double copy_bandwidth(int repeats) {
  const size_t n = size_t{64} << 20;  // bytes per buffer, well beyond the caches
  std::vector<char> a(n, 1), b(n, 0);
  const double s = median_seconds(repeats, [&] { std::memcpy(b.data(), a.data(), n); });
  return 2.0 * static_cast<double>(n) / s;  // read + write
}

// Bytes of stored activations per second that loom's elementwise kernels get through, forward
// and backward: SwiGLU over fused [gate | up] rows and RMSNorm, on tensors beyond the caches.
// The time plan charges every micro-batch's activations at this rate (besides its GEMMs).
double activation_rate(int repeats) {
  const int64_t rows = 4096, width = 1024;
  std::vector<float> gate_up(static_cast<size_t>(rows * 2 * width), 0.5f), dgate_up(gate_up.size()),
      out(static_cast<size_t>(rows * width)), dout(out.size(), 0.25f), weight(static_cast<size_t>(width), 1.0f),
      dweight(weight.size()), rstd(static_cast<size_t>(rows)), normed(out.size()), dnormed(out.size());
  const double s = median_seconds(repeats, [&] {
    kernels::swiglu_forward(Device::cpu(), out.data(), gate_up.data(), rows, width);
    kernels::rmsnorm_forward(Device::cpu(), normed.data(), rstd.data(), out.data(), weight.data(), rows, width, 1e-5f);
    kernels::rmsnorm_backward(Device::cpu(), dnormed.data(), dweight.data(), dout.data(), out.data(), weight.data(),
                              rstd.data(), rows, width);
    kernels::swiglu_backward(Device::cpu(), dgate_up.data(), dnormed.data(), gate_up.data(), rows, width);
  });
  // Stored for backward: the [gate | up] rows, the SwiGLU output (the norm's input), the norm's output.
  const double stored = 4.0 * static_cast<double>(gate_up.size() + out.size() + normed.size());
  return stored / s;
}

// Elements per second of what the precision recipes do to each GEMM operand on the CPU
// (model/linear_precision.h): copy it, then round it to bf16, or take its amax and quantize it
// to FP8 E4M3 and back with a per-tensor scale.
double cast_rate(bool fp8, int repeats) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> x(static_cast<size_t>(n)), buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i % 2003) - 1.0f;
  const double s = median_seconds(repeats, [&] {
    std::copy(x.begin(), x.end(), buf.begin());
    if (!fp8) {
      precision::round_to_bf16(buf.data(), n);
      return;
    }
    const precision::Fp8Format f = precision::Fp8Format::E4M3;
    const float scale = precision::compute_scale(precision::amax(x.data(), n), precision::max_finite(f));
    precision::quantize_dequantize_fp8(buf.data(), n, f, scale);
  });
  return static_cast<double>(n) / s;
}

// FLOP/s of the Mamba-2 scan kernels (model::ssd_scan_training_flops_per_token's count: the
// forward's, three times) through a forward and a backward at the shipped tiny Super's mixer
// shape (configs/nemotron3-super-tiny.yaml: 8 heads of 16 channels, state 16 in 2 groups, blocks
// of 64 tokens; a micro-batch of 8 sequences of 128).
double scan_rate(int repeats) {
  const kernels::SsdShape s{8, 128, 8, 16, 2, 16, 64, 8 * 16, 8, 2 * 16, 8 * 16};
  const int64_t rows = s.batch * s.seq, inner = s.heads * s.head_dim, bc = s.groups * s.state;
  const auto values = [](int64_t n, float step) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = step * static_cast<float>(i % 97) - 0.5f;
    return v;
  };
  const std::vector<float> x = values(rows * inner, 0.011f), dt = values(rows * s.heads, 0.007f),
                           per_head = values(s.heads, 0.1f), B = values(rows * bc, 0.013f),
                           C = values(rows * bc, 0.009f), dy = values(rows * inner, 0.005f);
  std::vector<float> y(x.size()), dx(x.size()), ddt(dt.size()), dB(B.size()), dC(C.size()), dheads(3 * s.heads);
  const double seconds = median_seconds(repeats, [&] {
    kernels::ssd_scan_forward(Device::cpu(), y.data(), x.data(), dt.data(), per_head.data(), per_head.data(), B.data(),
                              C.data(), per_head.data(), s, nullptr);
    kernels::ssd_scan_backward(Device::cpu(), dx.data(), ddt.data(), dheads.data(), dheads.data() + s.heads, dB.data(),
                               dC.data(), dheads.data() + 2 * s.heads, dy.data(), x.data(), dt.data(), per_head.data(),
                               per_head.data(), B.data(), C.data(), per_head.data(), s, nullptr);
  });
  const double forward = static_cast<double>(rows) * model::ssd_scan_forward_flops_per_token(
                                                         s.heads, s.head_dim, s.groups, s.state, s.chunk, s.seq);
  return 3.0 * forward / seconds;
}

// Bytes per second at which memory handed back to the system (core/release_pages.h)
// comes back when written again: the time of release + write less the write alone.
double fresh_memory_bandwidth(int repeats) {
  const size_t n = size_t{64} << 20;  // bytes
  std::vector<float> buf(n / sizeof(float), 1.0f);
  const double touch = median_seconds(repeats, [&] { std::memset(buf.data(), 1, n); });
  const double fresh = median_seconds(repeats, [&] {
    release_pages(buf.data(), n);
    std::memset(buf.data(), 1, n);
  });
  return fresh > touch ? static_cast<double>(n) / (fresh - touch) : 0.0;
}

// Latency from the smallest all-reduce, bandwidth from the largest (bus bandwidth).
Link threads_link(int ranks) {
  comm::CommBenchOptions options;
  options.ops = {"all_reduce"};
  options.min_bytes = 8;
  options.max_bytes = int64_t{16} << 20;
  options.iters = 10;
  options.warmup = 2;
  std::vector<comm::CommBenchRow> rows;
  std::mutex mutex;
  comm::LaunchOptions launch;
  launch.backend = "threads";
  launch.ranks = ranks;
  comm::launch(launch, [&](comm::Communicator& world) {
    std::vector<comm::CommBenchRow> mine = comm::run_comm_bench(world, options, nullptr);
    std::lock_guard<std::mutex> lock(mutex);
    if (world.rank() == 0) rows = std::move(mine);
  });
  Link link;
  // A ring all-reduce of n ranks takes 2(n-1) latency steps.
  link.latency = rows.front().seconds / (2.0 * std::max(1, ranks - 1));
  link.bandwidth = rows.back().busbw_gbps * 1e9;
  return link;
}

}  // namespace

Hardware measure_host(const CalibrationOptions& options, std::ostream* log) {
  Hardware hw;
  hw.name = "this host (loom bench hardware)";
  hw.shared = true;  // one core measured, then every processor (a rank's threads: train.threads over the ranks)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  hw.peak_flops = gemm_flops(2048, 2048, 2048, options.repeats);
  hw.cores = effective_cores(gemm_flops(1024, 1024, 1024, options.repeats), options.repeats);
  const double achieved = gemm_flops(options.gemm_rows, options.gemm_cols, options.gemm_inner, options.repeats);
  hw.gemm_efficiency = std::min(1.0, achieved / hw.peak_flops);
  // A short GEMM (one micro-batch of few tokens) runs slower: fit rows / (rows + h) to the rate at
  // 128 rows against the training-shaped one.
  const int64_t short_rows = 128;
  const double q = gemm_flops(short_rows, options.gemm_cols, options.gemm_inner, options.repeats) / achieved;
  const double r = static_cast<double>(options.gemm_rows), s = static_cast<double>(short_rows);
  hw.gemm_half_rows = q >= 1.0 ? 0.0 : r * q > s ? s * r * (1.0 - q) / (r * q - s) : 1e6;
  hw.memory_bandwidth = copy_bandwidth(options.repeats);
  hw.activation_bandwidth = activation_rate(options.repeats);
  hw.bf16_cast_rate = cast_rate(false, options.repeats);
  hw.fp8_cast_rate = cast_rate(true, options.repeats);
  hw.fresh_memory_bandwidth = fresh_memory_bandwidth(options.repeats);
  hw.scan_flops = scan_rate(options.repeats);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  // One process on every processor (train.threads: 0, one rank): its training-shaped GEMM and its
  // elementwise kernels against one thread's.
  hw.processors = omp_get_num_procs();
  const double threaded = gemm_flops(options.gemm_rows, options.gemm_cols, options.gemm_inner, options.repeats);
  hw.gemm_thread_speedup = threaded / achieved;
  hw.memory_thread_speedup = activation_rate(options.repeats) / hw.activation_bandwidth;
  struct sysinfo info {};
  hw.memory_bytes = ::sysinfo(&info) == 0 ? static_cast<double>(info.totalram) * info.mem_unit : 0.0;
  hw.ranks_per_node = 1 << 20;  // every rank of the threads backend is on this host
  const Link link = threads_link(options.ranks);
  for (Link& l : hw.links) l = link;
  if (log != nullptr) {
    *log << "one core: sgemm 2048: " << hw.peak_flops / 1e9 << " GFLOP/s; training-shaped GEMM " << options.gemm_rows << "x"
         << options.gemm_inner << "x" << options.gemm_cols << ": " << achieved / 1e9 << " GFLOP/s (half that rate at " << hw.gemm_half_rows << " rows); copy "
         << hw.memory_bandwidth / 1e9 << " GB/s; elementwise kernels " << hw.activation_bandwidth / 1e9
         << " GB of activations/s; casts to bf16 " << hw.bf16_cast_rate / 1e9 << " G elements/s, to FP8 "
         << hw.fp8_cast_rate / 1e9 << " G elements/s; Mamba-2 scan " << hw.scan_flops / 1e9
         << " GFLOP/s; handed-back memory faults in at " << hw.fresh_memory_bandwidth / 1e9
         << " GB/s; threads all-reduce on " << options.ranks << " ranks: latency "
         << link.latency * 1e6 << " us, bus bandwidth " << link.bandwidth / 1e9 << " GB/s; effective cores "
         << hw.cores << " of " << omp_get_num_procs() << "; on " << hw.processors << " threads the GEMM "
         << hw.gemm_thread_speedup << "x and the elementwise kernels " << hw.memory_thread_speedup << "x one's\n";
  }
  return hw;
}

std::string hardware_yaml(const Hardware& hw, const std::string& comment) {
  std::ostringstream o;
  o << "# " << comment << "\n";
  o << "device:\n  name: " << hw.name << "\n  peak_tflops: " << hw.peak_flops / 1e12
    << "\n  gemm_efficiency: " << hw.gemm_efficiency << "\n  gemm_half_rows: " << hw.gemm_half_rows << "\n  memory_gib: " << hw.memory_bytes / (1024.0 * 1024 * 1024)
    << "\n  memory_bandwidth_gbs: " << hw.memory_bandwidth / 1e9 << "\n  shared: " << (hw.shared ? "true" : "false")
    << "\n  cores: " << hw.cores << "\n  processors: " << hw.processors
    << "\n  gemm_thread_speedup: " << hw.gemm_thread_speedup
    << "\n  memory_thread_speedup: " << hw.memory_thread_speedup << "\n  activation_bytes: " << hw.activation_bytes
    << "\n  fused_attention: " << (hw.fused_attention ? "true" : "false") << "\n  scan_tflops: " << hw.scan_flops / 1e12
    << "\n  activation_gbs: " << hw.activation_bandwidth / 1e9
    << "\n  bf16_cast_gelems: " << hw.bf16_cast_rate / 1e9
    << "\n  fp8_cast_gelems: " << hw.fp8_cast_rate / 1e9 << "\n  fresh_memory_gbs: " << hw.fresh_memory_bandwidth / 1e9
    << "\nranks_per_node: " << hw.ranks_per_node << "\nlinks:\n";
  const char* names[] = {"node", "site", "cross_site"};
  for (int c = 0; c < comm::kLinkClasses; ++c) {
    o << "  " << names[c] << "_bandwidth_gbps: " << hw.links[c].bandwidth * 8 / 1e9 << "\n  " << names[c]
      << "_latency_us: " << hw.links[c].latency * 1e6 << "\n";
  }
  o << "step_overhead_ms: " << hw.step_overhead * 1e3 << "\ncomm_overlap: " << hw.comm_overlap << "\n";
  return o.str();
}

}  // namespace loom::plan
