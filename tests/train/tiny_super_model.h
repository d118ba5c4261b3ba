#pragma once
// Nemotron 3 Super's layer kinds in a model small enough for a test, with every width a multiple
// of 16 so that each linear can run FP8 on a GPU (cuBLASLt's products take no other size): layers
// M * M E (Mamba-2 mixers of 16 heads, whose in_proj is 2 x 64 + 2 x 2 x 16 + 16 = 208 wide),
// attention, a latent MoE layer (4 experts, top 2, latent 32, a shared expert) and 2 multi-token
// prediction depths. The GPU test (tests/cuda/model_cuda_test.cpp) trains it on the GPU, the
// emulated device's (device_hybrid_test.cpp) checks the same shapes on every CI run.

namespace loom::train::testing {

inline constexpr const char* kTinySuperModel =
    "model: {vocab_size: 0, d_model: 64, layers: 4, heads: 4, kv_heads: 2, ffn_size: 96, max_seq_len: 32,\n"
    "        activation: relu2, tied_embeddings: false, layer_pattern: 'M*ME', mtp_depths: 2,\n"
    "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 48, moe_latent_size: 32, moe_shared_ffn_size: 48,\n"
    "        mamba: {state_size: 16, heads: 16, head_dim: 4, groups: 2, conv_kernel: 4, chunk_size: 8}}\n";

}  // namespace loom::train::testing
