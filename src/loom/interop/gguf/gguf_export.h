#pragma once
// A loom checkpoint as a GGUF v3 file llama.cpp runs (architecture `llama`, with experts for a
// Mixtral-style mixture of experts, `qwen2` / `qwen2moe` for Qwen 2's q/k/v biases, `deci` for
// heterogeneous layers, model.block_configs, or
// `nemotron_h` for Nemotron-H hybrids, model.layer_pattern: gguf_nemotron_h.h):
// llama.cpp's tensor names, Q/K rows permuted from loom's (Hugging Face's) half-split RoPE layout
// to llama.cpp's interleaved one, Llama 3.1's scaled RoPE as `rope_freqs` factors, and the
// tokenizer as a GGUF `gpt2` (byte-level BPE) vocabulary (gguf_tokenizer.h). See docs/serving.md
// ("GGUF export") for what is supported.
#include <cstdint>
#include <string>

namespace loom::interop::gguf {

struct GgufExportOptions {
  std::string dtype = "f32";  // f32 | f16 | bf16 (matrices; norms stay f32)
};

struct GgufExportResult {
  std::string checkpoint;
  int64_t step = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;
  std::string architecture;  // llama.cpp's: llama, qwen2, qwen2moe, deci or nemotron_h
  std::string note;          // what the file leaves out of the model (its MTP depths), or empty
};

// Throws naming the model key when the checkpoint's model is not Llama-style (rms norm, SwiGLU,
// RoPE unscaled or llama3, q/k/v biases only, MoE only as Mixtral's or Qwen2-MoE's, layers llama.cpp's
// `deci` runs, hybrids as Hugging Face's NemotronH) or its tokenizer is one llama.cpp cannot reproduce.
GgufExportResult export_to_gguf(const std::string& checkpoint, const std::string& path, const GgufExportOptions& options);

}  // namespace loom::interop::gguf
