#pragma once
// Which Hugging Face tensor each loom parameter becomes. Most map one to one under a name
// (hf_moe.h, hf_nemotron_h.h); Nemotron-H's fused Mamba tensors concatenate several loom
// parameters along their first dimension (in_proj = [z; x; B; C; dt], conv1d = [x; B; C]), and
// its routers' e_score_correction_bias is loom's aux-loss-free expert bias, a checkpoint state
// tensor rather than a parameter.
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/config/run_config.h"
#include "loom/core/tensor.h"

namespace loom::interop::hf {

struct HfPiece {
  std::string name;  // a loom parameter, or a state tensor (state.*)
  Shape shape;       // its loom shape
};

struct HfTensor {
  std::string name;            // the Hugging Face name
  Shape shape;                 // the Hugging Face shape (elements: the pieces' sum)
  std::vector<HfPiece> pieces; // back to back, in row-major order
  bool state = false;          // the pieces are state tensors: zeros when a checkpoint lacks them
};

// Every Hugging Face tensor of `model` (vocab_size resolved), in model order.
std::vector<HfTensor> hf_tensors(const config::ModelConfig& model);

// A Hugging Face tensor's values from a loom checkpoint: its pieces back to back, as f32 (a state
// piece the checkpoint lacks, such as the expert bias of a model trained without one, is zeros).
std::vector<float> read_hf_tensor(const ckpt::LoadedCheckpoint& checkpoint, const HfTensor& t);

}  // namespace loom::interop::hf
