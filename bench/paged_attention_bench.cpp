// The CPU's paged attention (kernels::cpu::paged_attention, what `loom serve --device cpu` runs
// per attention layer and step): decoding steps (one row per sequence at its last position) and
// prompt chunks (the last ROWS positions of one sequence), over blocks of 16 positions scattered
// over the pool, fp32 and bf16 pools (`--kv-cache-dtype`). Prints one markdown row per case with
// the median time and the cache's bytes read per second (each key and value row once per row of
// the step). Usage: loom_bench_paged_attention [repeats=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "loom/core/blas_cpu.h"
#include "loom/core/dtype_convert.h"
#include "loom/kernels/cpu/paged_attention.h"

namespace {

using namespace loom;
using kernels::KvCacheDtype;
using kernels::PagedAttentionShape;

struct Case {
  const char* name;
  int64_t heads, kv_heads, head_dim, sequences, length, rows_per_sequence;
};

// configs/tiny.yaml's attention (8 heads on 4 kv heads of 32) and the ~1B config's (32 on 8 of 64).
const std::vector<Case> kCases = {{"tiny, decode 32 x 400", 8, 4, 32, 32, 400, 1},
                                  {"tiny, prompt chunk 448", 8, 4, 32, 1, 448, 448},
                                  {"~1B, decode 8 x 2048", 32, 8, 64, 8, 2048, 1},
                                  {"~1B, prompt chunk 512 at 2048", 32, 8, 64, 1, 2048, 512}};
constexpr int64_t kBlockSize = 16;

double median_ms(int repeats, const std::function<void()>& body) {
  std::vector<double> times;
  body();  // warm-up
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void run(const Case& c, KvCacheDtype dtype, int repeats) {
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t width = (c.length + kBlockSize - 1) / kBlockSize, blocks = c.sequences * width;
  const int64_t kv_width = c.kv_heads * c.head_dim, stride = (c.heads + 2 * c.kv_heads) * c.head_dim;
  std::vector<int32_t> tables(static_cast<size_t>(blocks)), sequences, positions;
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), generator);
  for (int64_t s = 0; s < c.sequences; ++s) {
    for (int64_t p = c.length - c.rows_per_sequence; p < c.length; ++p) {
      sequences.push_back(static_cast<int32_t>(s));
      positions.push_back(static_cast<int32_t>(p));
    }
  }
  const auto rows = static_cast<int64_t>(positions.size());
  std::vector<float> q(static_cast<size_t>(rows * stride)), out(static_cast<size_t>(rows * c.heads * c.head_dim));
  for (float& x : q) x = uniform(generator);
  const int64_t elements = blocks * kBlockSize * kv_width;
  std::vector<float> keys(static_cast<size_t>(elements)), values(keys.size());
  for (float& x : keys) x = uniform(generator);
  for (float& x : values) x = uniform(generator);
  std::vector<uint16_t> keys16(dtype == KvCacheDtype::Bf16 ? keys.size() : 0), values16(keys16.size());
  for (size_t i = 0; i < keys16.size(); ++i) {
    keys16[i] = f32_to_bf16(keys[i]);
    values16[i] = f32_to_bf16(values[i]);
  }
  const void* k_pool = keys16.empty() ? static_cast<const void*>(keys.data()) : keys16.data();
  const void* v_pool = values16.empty() ? static_cast<const void*>(values.data()) : values16.data();
  const PagedAttentionShape shape{c.heads, c.kv_heads, c.head_dim, kBlockSize, width, dtype};
  const double ms = median_ms(repeats, [&] {
    kernels::cpu::paged_attention(out.data(), q.data(), stride, k_pool, v_pool, tables.data(), sequences.data(),
                                  positions.data(), rows, shape);
  });
  int64_t read = 0;  // each row reads its positions' keys and values once
  for (int32_t p : positions) read += 2 * (p + 1) * kv_width * kernels::kv_cache_element_bytes(dtype);
  std::printf("| %s | %s | %.3f | %.1f |\n", c.name, dtype == KvCacheDtype::Bf16 ? "bf16" : "fp32", ms,
              static_cast<double>(read) / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  ensure_openblas_coretype(argv);
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  std::printf("| case | cache | median ms | cache GB/s |\n|---|---|---:|---:|\n");
  for (const Case& c : kCases) {
    run(c, KvCacheDtype::Fp32, repeats);
    run(c, KvCacheDtype::Bf16, repeats);
  }
  return 0;
}
