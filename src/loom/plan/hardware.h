#pragma once
// A hardware file (YAML) describes what a layout runs on, for `loom plan time` and `loom plan
// search`: one device's arithmetic and memory, and the links between ranks in the link classes
// of loom's topology (comm/topology.h: the same node, the same site, across sites), with
// bandwidths per rank in Gb/s and one-way latencies in microseconds as `topology.*` takes them.
//
//   device:
//     name: H100 SXM
//     peak_tflops: 989          # dense, in the compute dtype
//     gemm_efficiency: 0.6      # achieved fraction of peak in large GEMMs
//     gemm_half_rows: 0         # rows (tokens) at which a GEMM reaches half that rate (0: any)
//     gemm_writes_output: false # true: a GEMM writes its output after its products, at
//                               #   memory_bandwidth_gbs, on top of them (a GPU's epilogue:
//                               #   small-k products lose the most); false: hidden behind them
//     attention_efficiency: 0   # fraction of peak attention's score and value products reach
//                               #   (a fused kernel: FlashAttention / cuDNN); 0: gemm_efficiency
//     scan_tflops: 0            # the Mamba-2 scan kernels' rate, in model/flops.h's scan FLOPs
//                               #   (they compute in double); 0: half the GEMM rate (peak x
//                               #   gemm_efficiency / 2: a CPU's doubles per instruction)
//     memory_gib: 80
//     memory_bandwidth_gbs: 3350  # GB/s
//     shared: false             # true: a CPU host whose `cores` cores its ranks share; the
//     cores: 1                  #   numbers above are then one core's (one thread per rank);
//                               #   fractional when other work takes a share of the host
//     processors: 1             # shared: the host's processors, the threads a process takes
//                               #   by default (train.threads: 0), shared out over the ranks
//     gemm_thread_speedup: 1    # shared: one rank's speed-up on `processors` threads over
//     memory_thread_speedup: 1  #   one, for GEMM-bound work and for memory-bound work
//                               #   (elementwise kernels, casts, the optimizer); fewer threads
//                               #   get the share of it in proportion (1 thread: none)
//     activation_bytes: 2       # per stored activation element (4: loom's CPU backend)
//     fused_attention: true     # attention keeps no probabilities (a tiled / flash kernel, as
//                               #   loom's); false: it keeps batch x heads x seq^2 of them
//     activation_gbs: 0         # GB of stored activations per second the elementwise kernels
//                               #   (norms, activation functions, ...) get through forward and
//                               #   backward; 0: memory_bandwidth_gbs / 3 (three passes)
//     bf16_cast_gelems: 0       # G elements/s one rank copies and rounds a GEMM operand to bf16
//     fp8_cast_gelems: 0        #   / quantizes it to FP8 (amax, scale, quantize), as loom's CPU
//                               #   recipes do for every GEMM; 0 (both): casts cost nothing
//                               #   (fused into the kernels, as on GPUs)
//     fresh_memory_gbs: 0       # GB/s at which memory handed back to the system between uses
//                               #   (ZeRO-2/3, compact parameters) faults back in; 0: free (a
//                               #   caching allocator keeps it)
//   ranks_per_node: 8
//   links:
//     node_bandwidth_gbps: 3600   node_latency_us: 2
//     site_bandwidth_gbps: 400    site_latency_us: 5
//     cross_site_bandwidth_gbps: 100   cross_site_latency_us: 10500
//   host:                       # an offloaded optimizer (optim.cpu_offload), ZeRO-3 shards (parallel.offload_params)
//     link_gbs: 40              # GB/s each way between host memory and one device
//     memory_bandwidth_gbs: 30  # GB/s of host memory one rank's optimizer update gets
//   step_overhead_ms: 0         # fixed cost per step (launches, host work)
//   comm_overlap: 0.5           # fraction of data-parallel communication hidden behind backward
//
// Unknown keys, wrong types and values out of range are loom::Errors naming the file and key.
#include <string>

#include "loom/comm/topology.h"

namespace loom::plan {

struct Link {
  double bandwidth = 0.0;  // bytes per second, per rank
  double latency = 0.0;    // seconds, one way
};

struct Hardware {
  std::string source;  // the file, for messages
  std::string name;
  double peak_flops = 0.0;       // FLOP/s
  double fp8_peak_flops = 0.0;   // FLOP/s of FP8 products; 0: peak_flops (FP8 is emulated, no gain)
  double fp8_gemm_efficiency = 0.0;  // 0: gemm_efficiency
  double gemm_efficiency = 1.0;
  double attention_efficiency = 0.0;  // 0: gemm_efficiency
  double scan_flops = 0.0;       // FLOP/s of the Mamba-2 scan kernels; 0: half the GEMM rate
  double gemm_half_rows = 0.0;
  bool gemm_writes_output = false;
  double memory_bytes = 0.0;
  double memory_bandwidth = 0.0; // bytes per second
  bool shared = false;
  double cores = 1.0;            // shared: cores the host's ranks share (measured: effective)
  int processors = 1;            // shared: the threads a process takes by default
  double gemm_thread_speedup = 1.0;    // shared: on `processors` threads over one
  double memory_thread_speedup = 1.0;
  int activation_bytes = 4;
  bool fused_attention = true;
  double activation_bandwidth = 0.0;  // bytes of activations per second; 0: a third of memory_bandwidth
  double bf16_cast_rate = 0.0;   // elements per second per rank; both 0: casts are free
  double fp8_cast_rate = 0.0;    // 0 with a bf16 rate: the bf16 rate
  double fresh_memory_bandwidth = 0.0;  // bytes per second per rank; 0: no cost
  int ranks_per_node = 1;
  Link links[comm::kLinkClasses];
  double host_link_bandwidth = 40e9;    // bytes per second each way, host memory <-> one device
  double host_memory_bandwidth = 30e9;  // bytes per second of host memory per rank
  double step_overhead = 0.0;    // seconds
  double comm_overlap = 0.0;
  const Link& link(comm::LinkClass c) const { return links[static_cast<int>(c)]; }
  // FLOP/s and bytes/s one rank gets when `ranks` share the host (shared: true): one core's
  // when there are cores enough, else their share.
  double flops_per_rank(int ranks) const;
  // The same for the FP8 recipes' products (per-tensor and blockwise scaled; MXFP8 runs as bf16).
  double fp8_flops_per_rank(int ranks) const;
  // The same for attention's score and value products.
  double attention_flops_per_rank(int ranks) const;
  // The same for the Mamba-2 scan kernels (model::ssd_scan_training_flops_per_token).
  double scan_flops_per_rank(int ranks) const;
  // The fraction of that rate a GEMM over `rows` rows reaches: rows / (rows + gemm_half_rows).
  double gemm_rows_factor(double rows) const { return rows / (rows + gemm_half_rows); }
  double bandwidth_per_rank(int ranks) const;
  // Seconds for one rank's GEMMs to write `bytes` of output beyond their products (0 unless
  // gemm_writes_output).
  double gemm_output_seconds(double bytes) const { return gemm_writes_output ? bytes / bandwidth_per_rank(1) : 0.0; }
  // Bytes of activations per second one rank's elementwise kernels get through.
  double activation_rate_per_rank(int ranks) const;
  // One rank's speed-up on `threads` threads over one thread (shared hosts; elsewhere 1): the
  // measured speed-up at `processors` threads, in proportion for fewer, no more for more.
  double gemm_speedup(int threads) const { return thread_speedup(gemm_thread_speedup, threads); }
  double memory_speedup(int threads) const { return thread_speedup(memory_thread_speedup, threads); }
  double thread_speedup(double at_processors, int threads) const;
  // Whether the precision recipes' casts cost time on this device (a cast rate is given).
  bool costs_casts() const { return bf16_cast_rate > 0.0 || fp8_cast_rate > 0.0; }
  // Seconds for one rank to cast `elements` GEMM operand elements to bf16 / FP8 (0 when free).
  double cast_seconds(double elements, bool fp8, int ranks) const;
  // Seconds for one rank to fault `bytes` of handed-back memory in again (0 when free).
  double fresh_memory_seconds(double bytes, int ranks) const;
};

Hardware load_hardware(const std::string& path);
Hardware parse_hardware(const std::string& yaml_text, const std::string& source);

}  // namespace loom::plan
