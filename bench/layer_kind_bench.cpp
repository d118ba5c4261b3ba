// Where a training step's time goes, by layer kind. Builds the model of a config and times whole
// training steps on random tokens (forward and backward of every micro-batch, then the
// optimizer); then times one block of each layer kind alone, forward and backward on one
// micro-batch as the step runs it, and the Mamba-2 scan kernel alone on that block's own
// activations. A kind's share is its block time x its layers x micro-batches per step over the
// step time; the rest of the step (embeddings, head and loss, MTP depths, optimizer) is what the
// kinds leave. Also prints the parameters the main model activates per token (routed experts
// counted top_k of moe_experts, MTP depths not at all).
//   loom_bench_layers CONFIG.yaml [section.key=value ...] [--steps N] [--reps N]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_config.h"
#include "loom/config/run_config.h"
#include "loom/core/blas_cpu.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/tokenizer.h"
#include "loom/kernels/ops.h"
#include "loom/model/block.h"
#include "loom/optim/adamw.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/data/parameter_ranges.h"
#include "loom/train/model_setup.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::model::LayerSpec;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string kind_of(const LayerSpec& spec) {
  if (spec.has_mamba) return "mamba2";
  std::string kind = spec.has_attention ? "attention" : "";
  if (spec.has_mlp()) kind += std::string(kind.empty() ? "" : "+") + (spec.moe ? "moe" : "mlp");
  return kind;
}

// Uniform values in [-scale, scale], reproducible.
std::vector<float> random_values(int64_t n, uint64_t seed, float scale) {
  const uint64_t key = loom::philox_key(seed, "bench.layers");
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = scale * (static_cast<float>(loom::philox4x32(key, i)[0] % 2000001u) / 1e6f - 1.0f);
  }
  return v;
}

// The parameters one token passes through in the main model: a routed expert's count top_k /
// moe_experts of its weights; MTP depths (mtp.*) are left out.
double active_parameters(const loom::model::ParameterStore& store, const loom::config::ModelConfig& c) {
  double active = 0.0;
  for (const auto& p : store.list()) {
    if (p.name.rfind("mtp.", 0) == 0) continue;
    const bool routed = p.name.find(".experts.") != std::string::npos;
    active += routed ? static_cast<double>(p.numel) * c.moe.top_k / c.moe.experts : static_cast<double>(p.numel);
  }
  return active;
}

struct Timing {
  double forward = 0.0, backward = 0.0;
};

// One block of `spec` alone on [batch, seq] rows: median forward and backward seconds. For a
// Mamba-2 block, `scan` also gets the scan kernel's forward and backward on the block's own
// activations (the mixer's in_proj and convolution outputs).
Timing time_block(const loom::config::ModelConfig& c, int layer, const LayerSpec& spec, int64_t batch, int64_t seq,
                  int reps, Timing* scan) {
  loom::model::ParameterStore store;
  loom::model::TensorParallel tp;
  loom::kernels::RopeTable rope(c.max_seq_len, loom::model::head_dim(c), c.rope_theta);
  loom::model::Block block(store, tp, layer, c, spec, &rope);
  store.allocate();
  store.initialize(1234);
  const int64_t n = batch * seq * c.d_model;
  const std::vector<float> x = random_values(n, 1, 1.0f), dy = random_values(n, 2, 1e-3f);
  std::vector<float> y(n), dx(n);
  loom::model::Block::Saved saved;
  loom::model::Workspace work;
  loom::model::ParallelScratch scratch;
  std::vector<double> fwd, bwd, scan_fwd, scan_bwd;
  for (int r = 0; r <= reps; ++r) {  // rep 0 warms up
    auto start = Clock::now();
    block.forward(saved, x.data(), y.data(), batch, seq, {}, scratch);
    const double f = seconds_since(start);
    dx = dy;
    start = Clock::now();
    loom::model::ResidualGradForReader d_x16;  // none on the CPU
    block.backward(dx.data(), d_x16, x.data(), saved, work, batch, seq, {}, scratch);
    const double b = seconds_since(start);
    if (r > 0) fwd.push_back(f), bwd.push_back(b);
    if (!spec.has_mamba || scan == nullptr) continue;
    // The mixer's scan call (mamba2_mixer.cpp) on the saved in_proj (dt) and conv (x, B, C) rows.
    const auto& m = c.mamba;
    const int64_t heads = m.heads > 0 ? m.heads : m.expand * c.d_model / m.head_dim;
    const int64_t inner = heads * m.head_dim, gn = m.groups * m.state_size, channels = inner + 2 * gn;
    const int64_t proj_width = 2 * inner + 2 * gn + heads, rows = batch * seq;
    const loom::kernels::SsdShape shape{batch,  seq,      heads,      m.head_dim, m.groups, m.state_size,
                                        m.chunk_size, channels, proj_width, channels, inner};
    const std::string mixer = "model.layers." + std::to_string(layer) + ".mixer.";
    const float* dt_bias = store.value(store.find(mixer + "dt_bias"));
    const float* a_log = store.value(store.find(mixer + "A_log"));
    const float* d = store.value(store.find(mixer + "D"));
    const float* conv = saved.mamba.conv.data();
    const float* dt = saved.mamba.proj.data() + inner + channels;
    std::vector<float> out(rows * inner), d_conv(rows * channels), d_dt(rows * proj_width), d_heads(3 * heads);
    const std::vector<float> d_out = random_values(rows * inner, 3, 1e-3f);
    start = Clock::now();
    loom::kernels::ssd_scan_forward(loom::Device::cpu(), out.data(), conv, dt, dt_bias, a_log, conv + inner,
                                    conv + inner + gn, d, shape, nullptr);
    const double sf = seconds_since(start);
    start = Clock::now();
    loom::kernels::ssd_scan_backward(loom::Device::cpu(), d_conv.data(), d_dt.data() + inner + channels,
                                     d_heads.data(), d_heads.data() + heads, d_conv.data() + inner,
                                     d_conv.data() + inner + gn, d_heads.data() + 2 * heads, d_out.data(), conv, dt,
                                     dt_bias, a_log, conv + inner, conv + inner + gn, d, shape, nullptr);
    const double sb = seconds_since(start);
    if (r > 0) scan_fwd.push_back(sf), scan_bwd.push_back(sb);
  }
  if (scan != nullptr && !scan_fwd.empty()) *scan = {median(scan_fwd), median(scan_bwd)};
  return {median(fwd), median(bwd)};
}

// Median seconds of a whole training step (every micro-batch's forward_backward, the optimizer).
double time_steps(const loom::config::RunConfig& config, int steps) {
  loom::model::Transformer model(config.model);
  model.initialize(config.train.seed);
  loom::optim::AdamW optimizer(config.optim, model.params().total(),
                               loom::parallel::optimizer_segments(model.params()));
  const int micro = config.train.micro_batch, seq = config.data.seq_len;
  const int64_t tokens = static_cast<int64_t>(micro) * seq;
  const uint64_t key = loom::philox_key(config.train.seed, "bench.layers.tokens");
  std::vector<int32_t> inputs(tokens), targets(tokens);
  std::vector<double> times;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    const auto start = Clock::now();
    model.params().zero_grads();
    for (int m = 0; m < config.train.global_batch / micro; ++m) {
      for (int64_t i = 0; i < tokens; ++i) {
        const auto draw = loom::philox4x32(key, (static_cast<uint64_t>(step) * 64 + m) * tokens + i);
        inputs[i] = static_cast<int32_t>(draw[0] % config.model.vocab_size);
        targets[i] = static_cast<int32_t>(draw[1] % config.model.vocab_size);
      }
      model.forward_backward(inputs.data(), targets.data(), micro, seq, 1.0f / (config.train.global_batch * seq));
    }
    optimizer.step(model.params().values(), model.params().grads(),
                   loom::optim::learning_rate(config.optim, step + 1, config.train.steps), step + 1);
    if (step > 0) times.push_back(seconds_since(start));
  }
  std::printf("params total=%lld active_main=%.0f\n", static_cast<long long>(model.params().total()),
              active_parameters(model.params(), config.model));
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml [section.key=value ...] [--steps N] [--reps N]\n", argv[0]);
    return 2;
  }
  try {
    std::map<std::string, int> flags = {{"steps", 5}, {"reps", 5}};
    const loom::config::RunConfig config = loom::bench::load_bench_config(argc, argv, flags);
    const int steps = flags["steps"], reps = flags["reps"];
    const double step = time_steps(config, steps);
    const int64_t micro = config.train.micro_batch, seq = config.data.seq_len;
    const int micro_batches = config.train.global_batch / config.train.micro_batch;
    const double tokens = static_cast<double>(config.train.global_batch) * seq;
    std::printf("step median_ms=%.1f tokens_per_s=%.1f threads=%d\n", step * 1e3, tokens / step,
                omp_get_max_threads());
    const std::vector<LayerSpec> specs = loom::model::resolve_layers(config.model);
    std::map<std::string, std::vector<int>> layers_of;
    for (int l = 0; l < static_cast<int>(specs.size()); ++l) layers_of[kind_of(specs[l])].push_back(l);
    double kinds_total = 0.0;
    for (const auto& [kind, layers] : layers_of) {
      Timing scan;
      const bool mamba = specs[layers[0]].has_mamba;
      const Timing t = time_block(config.model, layers[0], specs[layers[0]], micro, seq, reps, mamba ? &scan : nullptr);
      const double in_step = (t.forward + t.backward) * layers.size() * micro_batches;
      kinds_total += in_step;
      std::printf("kind %-14s layers=%zu forward_ms=%.2f backward_ms=%.2f step_ms=%.1f share=%.3f\n", kind.c_str(),
                  layers.size(), t.forward * 1e3, t.backward * 1e3, in_step * 1e3, in_step / step);
      if (mamba) {
        const double scan_in_step = (scan.forward + scan.backward) * layers.size() * micro_batches;
        std::printf("  of which scan forward_ms=%.2f backward_ms=%.2f step_ms=%.1f share_of_step=%.3f "
                    "share_of_mixer=%.3f\n",
                    scan.forward * 1e3, scan.backward * 1e3, scan_in_step * 1e3, scan_in_step / step,
                    scan_in_step / in_step);
      }
    }
    std::printf("rest (embeddings, head and loss, MTP depths, optimizer) step_ms=%.1f share=%.3f\n",
                (step - kinds_total) * 1e3, (step - kinds_total) / step);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom_bench_layers: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
