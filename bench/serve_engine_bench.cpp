// loom's inference engine on a checkpoint: decode tokens/s with 1, 8 and 32 sequences decoding
// together, prompt (prefill) tokens/s, and time-to-first-token / inter-token latency percentiles.
// Prints one JSON object per measurement (bench/serve_bench.sh runs it next to llama.cpp;
// scripts/gpu_test.sh on cpu and cuda). DEVICE: where the engine runs (cuda where this build has
// the CUDA backend); DTYPE: its GEMMs (`loom serve --dtype`: auto, fp32, bf16, fp16); KV: its KV
// cache's elements (`--kv-cache-dtype`: auto, fp32, bf16); SPEC: tokens drafted a step by the
// model's multi-token prediction depths (`--speculative-config`, 0: none; bench/speculative_bench.sh),
// whose runs also print the share of drafts kept and the tokens per forward; PROMPT_TEXT: a text
// file the prompts are cut from (each at its own offset; default: synthetic bytes).
// Usage: loom_bench_serve CHECKPOINT [PROMPT_TOKENS=64] [DECODE_TOKENS=64] [PREFILL_TOKENS=448] [DEVICE=cpu]
//        [DTYPE=auto] [KV=auto] [SPEC=0] [PROMPT_TEXT]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/infer/engine.h"
#ifdef LOOM_WITH_CUDA
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda_entries.h"
#endif

namespace {
const char* g_device = "cpu";
std::string g_dtype = "fp32";  // the engine's GEMMs (its recipe)
std::string g_kv = "fp32";     // its KV cache's elements
std::vector<int32_t> g_text;   // PROMPT_TEXT's tokens (empty: synthetic prompts)
using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::vector<int32_t> prompt_of(int64_t length, int salt) {
  if (!g_text.empty()) {  // a cut of the text at the salt's own offset
    std::vector<int32_t> p;
    const size_t start = (static_cast<size_t>(salt) * 7919) % g_text.size();
    for (int64_t i = 0; i < length; ++i) p.push_back(g_text[(start + static_cast<size_t>(i)) % g_text.size()]);
    return p;
  }
  std::vector<int32_t> p;
  for (int64_t i = 0; i < length; ++i) p.push_back(static_cast<int32_t>(32 + (i * 7 + salt * 13) % 90));
  return p;
}

// `sequences` requests of `prompt` tokens each generating `decode` tokens, all submitted at once.
void run(loom::infer::Engine& engine, int sequences, int64_t prompt, int64_t decode) {
  loom::infer::RequestOptions o;
  o.sampling.temperature = 0.0;
  o.max_tokens = decode;
  o.ignore_eos = true;
  std::vector<std::shared_ptr<loom::infer::RequestStream>> streams;
  const auto start = Clock::now();
  for (int s = 0; s < sequences; ++s) streams.push_back(engine.submit(prompt_of(prompt, s), o));
  std::vector<Clock::time_point> last(sequences);
  std::vector<double> ttft, itl;
  std::vector<int64_t> got(sequences, 0);
  Clock::time_point first_all = start;
  loom::infer::EngineMetrics& m = engine.metrics();
  const int64_t steps_before = m.steps.load(), drafted_before = m.spec_draft_tokens.load();
  const int64_t kept_before = m.spec_accepted_tokens.load(), generated_before = m.generation_tokens.load();
  while (engine.step()) {
    const auto now = Clock::now();
    for (int s = 0; s < sequences; ++s) {
      for (const auto& e : streams[s]->pop(std::chrono::milliseconds(0))) {
        for (size_t k = 0; k < e.tokens.size(); ++k) {
          if (got[s]++ == 0) ttft.push_back(seconds(now - start));
          else itl.push_back(seconds(now - last[s]));
          last[s] = now;
        }
      }
    }
    if (ttft.size() == static_cast<size_t>(sequences) && first_all == start) first_all = now;
  }
  const auto end = Clock::now();
  // Decode throughput: tokens after each sequence's first, over the time after all had their first.
  const double decode_tokens = static_cast<double>(sequences) * static_cast<double>(decode - 1);
  std::printf("{\"engine\": \"loom\", \"device\": \"%s\", \"dtype\": \"%s\", \"kv\": \"%s\", \"sequences\": %d, "
              "\"prompt\": %lld, \"decode\": %lld, \"decode_tokens_per_s\": %.1f, \"ttft_p50_ms\": %.2f, "
              "\"ttft_p90_ms\": %.2f, \"itl_p50_ms\": %.2f, \"itl_p90_ms\": %.2f, \"itl_p99_ms\": %.2f",
              g_device, g_dtype.c_str(), g_kv.c_str(), sequences, static_cast<long long>(prompt),
              static_cast<long long>(decode), decode_tokens / seconds(end - first_all), 1e3 * percentile(ttft, 0.5),
              1e3 * percentile(ttft, 0.9), 1e3 * percentile(itl, 0.5), 1e3 * percentile(itl, 0.9),
              1e3 * percentile(itl, 0.99));
  if (engine.speculative_tokens() > 0) {
    const double drafted = static_cast<double>(m.spec_draft_tokens.load() - drafted_before);
    const double kept = static_cast<double>(m.spec_accepted_tokens.load() - kept_before);
    const double steps = static_cast<double>(m.steps.load() - steps_before);
    std::printf(", \"speculative_tokens\": %d, \"drafts_kept\": %.3f, \"tokens_per_step\": %.2f",
                engine.speculative_tokens(), drafted > 0 ? kept / drafted : 0.0,
                static_cast<double>(m.generation_tokens.load() - generated_before) / std::max(steps, 1.0));
  }
  std::printf("}\n");
  std::fflush(stdout);
}

void prefill(loom::infer::Engine& engine, int64_t tokens) {
  loom::infer::RequestOptions o;
  o.sampling.temperature = 0.0;
  o.max_tokens = 1;
  o.ignore_eos = true;
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    auto stream = engine.submit(prompt_of(tokens, 100 + rep), o);
    const auto start = Clock::now();
    while (engine.step()) {
    }
    best = std::max(best, static_cast<double>(tokens) / seconds(Clock::now() - start));
  }
  std::printf("{\"engine\": \"loom\", \"device\": \"%s\", \"dtype\": \"%s\", \"kv\": \"%s\", \"prefill_tokens\": %lld, "
              "\"prompt_tokens_per_s\": %.1f}\n",
              g_device, g_dtype.c_str(), g_kv.c_str(), static_cast<long long>(tokens), best);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s CHECKPOINT [PROMPT_TOKENS] [DECODE_TOKENS] [PREFILL_TOKENS] [cpu|cuda] [DTYPE] [KV] [SPEC] "
                 "[PROMPT_TEXT]\n",
                 argv[0]);
    return 2;
  }
  const int64_t prompt = argc > 2 ? std::atoll(argv[2]) : 64, decode = argc > 3 ? std::atoll(argv[3]) : 64;
  const int64_t prefill_tokens = argc > 4 ? std::atoll(argv[4]) : 448;
  loom::infer::EngineOptions options;
  options.max_batch_tokens = 512;
  options.max_running = 64;
  options.kv_cache_bytes = 256ll << 20;
  if (argc > 5) g_device = argv[5];
  if (std::string(g_device) == "cuda") {
#ifdef LOOM_WITH_CUDA
    loom::kernels::set_cuda_starter(&loom::kernels::cuda::start_backend);
#endif
    options.device = loom::config::RuntimeDevice::Cuda;
  } else if (std::string(g_device) != "cpu") {
    std::fprintf(stderr, "DEVICE must be cpu or cuda, got '%s'\n", g_device);
    return 2;
  }
  try {
    if (argc > 6) options.dtype = loom::infer::parse_inference_dtype(argv[6]);
    if (argc > 7) options.kv_cache_dtype = loom::infer::parse_kv_cache_setting(argv[7]);
    if (argc > 8) options.speculative_tokens = std::atoi(argv[8]);
    loom::infer::Engine engine(argv[1], options);
    if (argc > 9) {
      std::ifstream file(argv[9], std::ios::binary);
      if (!file) throw std::runtime_error(std::string("PROMPT_TEXT: cannot read ") + argv[9]);
      const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
      g_text = engine.tokenizer().encode(text);
    }
    g_dtype = loom::config::name_of(engine.recipe());
    g_kv = loom::config::name_of(engine.kv_cache_dtype());
    run(engine, 1, prompt, 8);  // warm-up
    for (int sequences : {1, 8, 32}) run(engine, sequences, prompt, decode);
    prefill(engine, prefill_tokens);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_bench_serve: %s\n", e.what());
    return 1;
  }
  return 0;
}
