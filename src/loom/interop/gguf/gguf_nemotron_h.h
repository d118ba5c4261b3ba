#pragma once
// A Nemotron-H hybrid (model.layer_pattern: Mamba-2 mixers, attention, squared-ReLU MLPs and
// latent MoE layers, as Nemotron 3 Super) as llama.cpp's `nemotron_h` architecture. llama.cpp
// converts Hugging Face's NemotronHForCausalLM, so the tensors go out as loom's Hugging Face
// export has them (interop/hf/hf_nemotron_h.h: in_proj = [z; x; B; C; dt], conv1d = [x; B; C]) under
// llama.cpp's names, with its converter's changes: A = -exp(A_log), the convolution's kernel rows,
// the gated norm's weight by group, each projection's experts stacked into one tensor. The
// multi-token prediction depths are left out.
#include <functional>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/config/run_config.h"
#include "loom/core/tensor.h"
#include "loom/interop/gguf/gguf_writer.h"

namespace loom::interop::gguf {

inline bool is_hybrid(const config::ModelConfig& model) { return !model.layer_pattern.empty(); }

// What llama.cpp's `nemotron_h` cannot run beyond what Hugging Face's NemotronH cannot express
// (hf::check_nemotron_h_exportable): MLP and MoE layers in one model (with experts, it takes every
// feed-forward layer for a MoE layer). An Error naming model.layer_pattern.
void check_nemotron_h_layers(const config::ModelConfig& model);

// `nemotron_h.*` metadata: a layer's kind by its counts (a Mamba-2 layer: no kv heads and no ffn;
// attention: kv heads, no ffn; MLP and MoE: an ffn), the SSM's sizes, the experts'.
void add_nemotron_h_metadata(GgufWriter& w, const config::ModelConfig& model);

// Whether a tensor is written in f32 whatever the export's dtype: vectors, and the Mamba-2
// mixer's A, D, convolution and norm weights, which llama.cpp's CPU scan and convolution read as f32.
bool stays_f32(const std::string& name, const Shape& shape);

// Calls `put` with each tensor's llama.cpp name, shape (row-major) and values, in model order.
using PutTensor = std::function<void(const std::string& name, const Shape& shape, const std::vector<float>& values)>;
void put_nemotron_h_tensors(const ckpt::LoadedCheckpoint& checkpoint, const config::ModelConfig& model,
                            const PutTensor& put);

}  // namespace loom::interop::gguf
