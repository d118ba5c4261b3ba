#include "loom/interop/hf/hf_tensor_map.h"

#include "loom/core/dtype_convert.h"
#include "loom/interop/hf/hf_moe.h"
#include "loom/interop/hf/hf_nemotron_h.h"
#include "loom/model/parameter_shapes.h"

namespace loom::interop::hf {

std::vector<HfTensor> hf_tensors(const config::ModelConfig& model) {
  if (is_nemotron_h_model(model)) return nemotron_h_tensors(model);
  std::vector<HfTensor> out;
  for (const model::ParameterShape& p : model::model_parameter_shapes(model))
    out.push_back({hf_tensor_name(model, p.name), p.shape, {{p.name, p.shape}}, false});
  return out;
}

std::vector<float> read_hf_tensor(const ckpt::LoadedCheckpoint& checkpoint, const HfTensor& t) {
  std::vector<float> values;
  for (const HfPiece& piece : t.pieces) {
    const int64_t n = shape_numel(piece.shape);
    const size_t at = values.size();
    values.resize(at + static_cast<size_t>(n), 0.0f);
    if (t.state && !checkpoint.has(piece.name)) continue;
    const DType stored = checkpoint.dtype(piece.name);
    std::vector<std::byte> raw(static_cast<size_t>(n) * dtype_size(stored));
    checkpoint.read(piece.name, raw.data(), stored, piece.shape);
    to_f32(values.data() + at, raw.data(), n, stored);  // little-endian, as loom (x86-64) and safetensors
  }
  return values;
}

}  // namespace loom::interop::hf
