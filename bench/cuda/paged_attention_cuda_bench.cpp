// loom's paged attention on the GPU (kernels/cuda/paged_attention.h) for decoding: one query row
// per sequence at its last position, over a paged cache of bf16 or fp32 pools (`loom serve
// --kv-cache-dtype`), blocks of 16 positions scattered over the pool as a serving engine's are.
// Each shape runs again with every sequence's blocks in order in the pool (`blocks in order`),
// which separates the scattered reads' cost from the kernel's own: on an H200 on 2026-12-04 the
// bf16 cache was read at 0.47 TB/s and the fp32 one at 1.9 (B16 L4096), against SDPA's 3.3.
// Decoding attention is bound by reading the keys and values, so the rate is those bytes over
// the time (GB/s). Each timed call reads another copy of the cache, cycling through more than
// 256 MiB, so the keys come from memory as in a real step (where every other layer's cache
// passes through L2 between two reads of this one), not from a 50 MB L2. bench/cuda/torch_cuda_peer.py
// decode times PyTorch's scaled_dot_product_attention on the same shapes over contiguous caches.
// Then prompt rows (prefill) over a bf16 cache, bound by the products: the CUDA-core kernel every
// row took before (paged_attention) and the tensor-core one (paged_prompt_attention.h), in TFLOP/s
// of the causal products (4 x heads x head_dim per visible key and row); torch_cuda_peer.py prefill
// times PyTorch's SDPA on the same queries over contiguous keys and values.
// Prints DECODE|impl|op|shape|ms|GB/s and PREFILL|impl|op|shape|ms|TFLOP/s lines.
// Usage: loom_bench_paged_attention_cuda
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/paged_attention.h"
#include "loom/kernels/cuda/paged_prompt_attention.h"

namespace {

using namespace loom::kernels::cuda;
using loom::kernels::KvCacheDtype;
using loom::kernels::PagedAttentionShape;

struct Shape {
  const char* name;
  int64_t batch, length, heads, kv_heads, dim;
};

// torch_cuda_peer.py's DECODE list: the ~1B Llama's attention (32 heads on 8 kv heads, d 64) from
// one long sequence to a full batch, and an 8B-style head_dim 128.
const std::vector<Shape> kShapes = {{"llama1b", 1, 4096, 32, 8, 64},
                                    {"llama1b", 1, 32768, 32, 8, 64},
                                    {"llama1b", 16, 4096, 32, 8, 64},
                                    {"llama1b", 64, 2048, 32, 8, 64},
                                    {"d128", 8, 8192, 32, 8, 128}};
constexpr int64_t kBlockSize = 16;
constexpr int64_t kCycleBytes = int64_t{256} << 20;

template <typename T>
T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&device), host.size() * sizeof(T)), "cudaMalloc");
  check_cuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return device;
}

// A pool of `elements` values in [-1, 1) as the cache's elements: a random run of up to 4M
// repeated (the rate does not depend on the values; generating them all would take seconds).
void* random_pool(int64_t elements, KvCacheDtype dtype, uint32_t seed) {
  const int64_t run = std::min<int64_t>(elements, int64_t{1} << 22);
  const int64_t element_bytes = dtype == KvCacheDtype::Bf16 ? 2 : 4;
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> floats(static_cast<size_t>(run));
  for (float& x : floats) x = uniform(generator);
  std::vector<__nv_bfloat16> halves(dtype == KvCacheDtype::Bf16 ? floats.size() : 0);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = __float2bfloat16(floats[i]);
  const void* source = halves.empty() ? static_cast<const void*>(floats.data()) : halves.data();
  char* pool = nullptr;
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&pool), elements * element_bytes), "cudaMalloc");
  for (int64_t at = 0; at < elements; at += run) {
    const int64_t n = std::min(run, elements - at);
    check_cuda(cudaMemcpy(pool + at * element_bytes, source, n * element_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  return pool;
}

// `in_order`: each sequence's blocks one after another in the pool (a diagnosis: against the
// shuffled blocks it separates the scattered reads' cost from the kernel's own).
void bench(const Shape& s, KvCacheDtype dtype, bool in_order = false) {
  const int64_t element_bytes = dtype == KvCacheDtype::Bf16 ? 2 : 4;
  const int64_t kv_width = s.kv_heads * s.dim, width = s.length / kBlockSize;
  const int64_t bytes_per_call = 2 * s.batch * s.length * kv_width * element_bytes;  // keys and values read
  const int64_t copies = std::max<int64_t>(1, (kCycleBytes + bytes_per_call - 1) / bytes_per_call);
  const int64_t blocks = copies * s.batch * width;
  // Block tables of every copy over one shuffled pool.
  std::vector<int32_t> tables(static_cast<size_t>(blocks));
  std::iota(tables.begin(), tables.end(), 0);
  if (!in_order) std::shuffle(tables.begin(), tables.end(), std::mt19937(11));
  std::vector<int32_t> sequences(static_cast<size_t>(s.batch)), positions(static_cast<size_t>(s.batch), 0);
  std::iota(sequences.begin(), sequences.end(), 0);
  std::fill(positions.begin(), positions.end(), static_cast<int32_t>(s.length - 1));
  int32_t* d_tables = upload(tables);
  int32_t* d_sequences = upload(sequences);
  int32_t* d_positions = upload(positions);
  void* keys = random_pool(blocks * kBlockSize * kv_width, dtype, 1);
  void* values = random_pool(blocks * kBlockSize * kv_width, dtype, 2);
  const int64_t q_stride = (s.heads + 2 * s.kv_heads) * s.dim;
  float* q = loom::bench::random_device_floats(s.batch * q_stride, 3);
  float* out = nullptr;
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&out), s.batch * s.heads * s.dim * sizeof(float)), "cudaMalloc");
  const PagedAttentionShape shape{s.heads, s.kv_heads, s.dim, kBlockSize, width, dtype};
  int64_t call = 0;
  const double ms = loom::bench::time_ms(
      [&] {
        const int32_t* copy_tables = d_tables + (call++ % copies) * s.batch * width;
        paged_attention(out, q, q_stride, keys, values, copy_tables, d_sequences, d_positions, s.batch, shape);
      },
      static_cast<int>(copies), static_cast<int>(std::max<int64_t>(20, 2 * copies)));
  const std::string name = std::string(s.name) + " B" + std::to_string(s.batch) + " L" + std::to_string(s.length) +
                           " H" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " D" +
                           std::to_string(s.dim);
  std::printf("DECODE|loom|decode attention %s cache%s|%s|%.4f|%.1f\n", dtype == KvCacheDtype::Bf16 ? "bf16" : "fp32",
              in_order ? ", blocks in order" : "", name.c_str(), ms,
              static_cast<double>(bytes_per_call) / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
  for (void* p : std::vector<void*>{d_tables, d_sequences, d_positions, keys, values, q, out}) cudaFree(p);
}

// A prompt chunk of `rows` rows ending at position length - 1 of one sequence.
struct PrefillShape {
  const char* name;
  int64_t rows, length, heads, kv_heads, dim;
};
// torch_cuda_peer.py's PREFILL list: a whole 2048-token prompt, a 512-row chunk at the end of 8192
// positions and a 256-row one (loom serve's --max-batch-tokens) at the end of 32768 on the ~1B
// Llama's heads, and a 1024-token prompt at head_dim 128.
const std::vector<PrefillShape> kPrefillShapes = {{"llama1b", 2048, 2048, 32, 8, 64},
                                                  {"llama1b", 512, 8192, 32, 8, 64},
                                                  {"llama1b", 256, 32768, 32, 8, 64},
                                                  {"d128", 1024, 1024, 32, 8, 128}};

void prefill(const PrefillShape& s) {
  const int64_t kv_width = s.kv_heads * s.dim, width = s.length / kBlockSize, first = s.length - s.rows;
  std::vector<int32_t> table(static_cast<size_t>(width));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(13));
  std::vector<int32_t> sequences(static_cast<size_t>(s.rows), 0), positions(static_cast<size_t>(s.rows)), tiles;
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(first));
  // The engine's tiles: up to kPromptTileRows rows, the ones reaching furthest first.
  for (int64_t end = s.rows; end > 0; end -= loom::kernels::kPromptTileRows) {
    const int64_t start = std::max<int64_t>(0, end - loom::kernels::kPromptTileRows);
    tiles.insert(tiles.end(), {static_cast<int32_t>(start), static_cast<int32_t>(end - start)});
  }
  int32_t* d_table = upload(table);
  int32_t* d_sequences = upload(sequences);
  int32_t* d_positions = upload(positions);
  int32_t* d_tiles = upload(tiles);
  void* keys = random_pool(width * kBlockSize * kv_width, KvCacheDtype::Bf16, 4);
  void* values = random_pool(width * kBlockSize * kv_width, KvCacheDtype::Bf16, 5);
  const int64_t q_stride = (s.heads + 2 * s.kv_heads) * s.dim;
  float* q = loom::bench::random_device_floats(s.rows * q_stride, 6);
  float* out = nullptr;
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&out), s.rows * s.heads * s.dim * sizeof(float)), "cudaMalloc");
  const PagedAttentionShape shape{s.heads, s.kv_heads, s.dim, kBlockSize, width, KvCacheDtype::Bf16};
  const int64_t tile_count = static_cast<int64_t>(tiles.size() / 2);
  // The causal products: row at position p sees p + 1 keys.
  const double flops =
      4.0 * static_cast<double>(s.heads * s.dim) * static_cast<double>(first + 1 + s.length) * s.rows / 2.0;
  const std::string name = std::string(s.name) + " rows " + std::to_string(s.rows) + " L" + std::to_string(s.length) +
                           " H" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " D" +
                           std::to_string(s.dim);
  const double cuda_cores = loom::bench::time_ms(
      [&] { paged_attention(out, q, q_stride, keys, values, d_table, d_sequences, d_positions, s.rows, shape); }, 2, 5);
  const double tensor_cores = loom::bench::time_ms([&] {
    paged_prompt_attention(out, q, q_stride, keys, values, d_table, d_sequences, d_positions, d_tiles, tile_count,
                           s.length, shape);
  });
  for (const auto& [op, ms] : {std::pair{"prompt attention CUDA cores", cuda_cores},
                               std::pair{"prompt attention tensor cores", tensor_cores}}) {
    std::printf("PREFILL|loom|%s|%s|%.4f|%.1f\n", op, name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  }
  std::fflush(stdout);
  for (void* p : std::vector<void*>{d_table, d_sequences, d_positions, d_tiles, keys, values, q, out}) cudaFree(p);
}

}  // namespace

int main() {
  return loom::bench::gpu_main("loom_bench_paged_attention_cuda", "paged attention", [] {
    for (const Shape& s : kShapes) {
      bench(s, KvCacheDtype::Bf16);
      bench(s, KvCacheDtype::Fp32);
      bench(s, KvCacheDtype::Bf16, true);
      bench(s, KvCacheDtype::Fp32, true);
    }
    for (const PrefillShape& s : kPrefillShapes) prefill(s);
  });
}
