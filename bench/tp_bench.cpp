// Tensor parallelism on the threads backend: step time (forward + backward of one micro-batch)
// at tp = 1, 2 (with and without sequence parallelism), activation bytes per rank, and the
// bytes each rank sends per step (counted by the simulated links, which add no delay here)
// against the analytic volume of the f/g operators with ring collectives.
//   usage: loom_bench_tp [iterations]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/comm/simulated_links.h"
#include "loom/model/transformer.h"

namespace {

using namespace loom;

struct Result {
  double seconds = 0;
  int64_t activation_bytes = 0;
  int64_t sent_bytes = 0;
};

// Bytes one rank sends per micro-batch step. A ring all-reduce of n bytes sends 2 (p-1)/p n; an
// all-gather or reduce-scatter of n (full) bytes sends (p-1)/p n. Per block (attention and MLP
// sub-blocks, s of them): without sequence parallelism g forward and f backward are one
// all-reduce each of the [rows, d_model] activations; with it, forward all-gather (f) and
// reduce-scatter (g), backward all-gather (g) and reduce-scatter (f), plus the all-gather again
// of the column-parallel input for its weight gradient. The embedding (g), the head (f) and the
// cross-entropy's per-row statistics (3 floats per row) come on top.
double analytic_bytes(const config::ModelConfig& c, int64_t rows, int p, bool sp) {
  const double act = static_cast<double>(rows) * c.d_model * 4.0, frac = (p - 1.0) / p;
  const double sub_blocks = 2.0 * c.layers;
  if (!sp) return frac * (2.0 * act * (2.0 * sub_blocks + 2.0) + 2.0 * rows * 3.0 * 4.0);
  return frac * (act * (5.0 * sub_blocks + 2.0 + 2.0) + 2.0 * rows * 3.0 * 4.0);
}

Result run(const config::ModelConfig& config, int tp, bool sp, int64_t batch, int64_t seq, int iterations) {
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = tp;
  auto links = std::make_shared<comm::SimulatedLinks>(comm::topology_from_blocks(tp, tp, 0), comm::LinkSpecs{});
  options.link_model = links;
  Result result;
  std::vector<int32_t> tokens(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % config.vocab_size);
    targets[i] = static_cast<int32_t>((i * 104729 + 1) % config.vocab_size);
  }
  comm::launch(options, [&](comm::Communicator& world) {
    const int threads = std::max(1, omp_get_num_procs() / tp);
    omp_set_num_threads(threads);
    model::Transformer model(config, model::TensorParallel(&world, sp));
    model.initialize(1);
    model.forward_backward(tokens.data(), targets.data(), batch, seq, 1e-3f);  // warm-up: buffers
    world.barrier();
    if (world.rank() == 0) links->reset();
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) model.forward_backward(tokens.data(), targets.data(), batch, seq, 1e-3f);
    world.barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (world.rank() == 0) {
      result.seconds = seconds / iterations;
      result.activation_bytes = model.activation_bytes();
      result.sent_bytes = links->bytes_sent(0, comm::LinkClass::SameNode) / iterations;
    }
  });
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 3;
  config::ModelConfig c;  // GPT-2-small-like width, 4 layers, byte vocabulary
  c.vocab_size = 256;
  c.d_model = 768;
  c.layers = 4;
  c.heads = 12;
  c.ffn_size = 3072;
  c.max_seq_len = 256;
  const int64_t batch = 4, seq = 256, rows = batch * seq;
  std::printf("model d_model %d, %d layers, heads %d, ffn %d; micro-batch %lld x %lld tokens; %d cores\n", c.d_model,
              c.layers, c.heads, c.ffn_size, static_cast<long long>(batch), static_cast<long long>(seq),
              omp_get_num_procs());
  std::printf("%-12s %12s %18s %18s %18s\n", "layout", "step ms", "activations MiB", "sent MiB/step", "analytic MiB");
  const Result one = run(c, 1, false, batch, seq, iterations);
  std::printf("%-12s %12.1f %18.1f %18s %18s\n", "tp1", one.seconds * 1e3, one.activation_bytes / 1048576.0, "0", "0");
  for (bool sp : {false, true}) {
    const Result r = run(c, 2, sp, batch, seq, iterations);
    std::printf("%-12s %12.1f %18.1f %18.2f %18.2f\n", sp ? "tp2+sp" : "tp2", r.seconds * 1e3,
                r.activation_bytes / 1048576.0, r.sent_bytes / 1048576.0, analytic_bytes(c, rows, 2, sp) / 1048576.0);
  }
  return 0;
}
