#pragma once
// Small model configs the whole-model tests share.
#include "loom/config/run_config.h"

namespace loom::model::testing {

// GPT-2 style (LayerNorm, GELU, learned positions, biases, tied embeddings) at a size whose
// finite differences run in milliseconds.
inline config::ModelConfig small_gpt2() {
  config::ModelConfig c;
  c.vocab_size = 23;
  c.d_model = 12;
  c.layers = 2;
  c.heads = 3;
  c.ffn_size = 20;
  c.norm = config::Norm::Layer;
  c.activation = config::Activation::Gelu;
  c.positions = config::Positions::Learned;
  c.tied_embeddings = true;
  c.bias = true;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  return c;
}

}  // namespace loom::model::testing
