#include "loom/interop/hf/hf_convert.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint.h"
#include "loom/interop/hf/safetensors.h"
#include "loom/ckpt/tensor_names.h"
#include "loom/core/atomic_file.h"
#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/tokenizer.h"
#include "loom/interop/hf/tokenizer_files.h"
#include "loom/interop/hf/hf_moe.h"
#include "loom/interop/hf/hf_qwen2_moe.h"
#include "loom/interop/hf/hf_config.h"
#include "loom/interop/hf/hf_nemotron_h.h"
#include "loom/interop/hf/hf_tensor_map.h"
#include "loom/model/parameter_shapes.h"
#include "loom/train/model_setup.h"

namespace loom::interop::hf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kConfigFile = "config.json";
// Metadata --to-hf writes besides "format": the tokenizer, so --from-hf can restore it.
constexpr const char* kTokenizerMetadata = "loom.tokenizer";
// Where --from-hf puts the model directory's tokenizer files, under the checkpoint root.
constexpr const char* kTokenizerDir = "tokenizer";

std::string architecture_of(const config::ModelConfig& model) {
  if (is_nemotron_h_model(model)) return kNemotronHArchitecture;
  if (is_qwen2_moe_model(model)) return kQwen2MoeArchitecture;
  if (is_moe_model(model)) return kMixtralArchitecture;
  if (is_qwen2_model(model)) return "Qwen2ForCausalLM";
  return model.block_configs.empty() ? "LlamaForCausalLM" : "DeciLMForCausalLM";
}

// The loom dtype of a safetensors float dtype; nullopt for the others.
std::optional<DType> float_dtype(const std::string& safetensors_dtype) {
  if (safetensors_dtype == "F32") return DType::F32;
  if (safetensors_dtype == "BF16") return DType::BF16;
  if (safetensors_dtype == "F16") return DType::F16;
  return std::nullopt;
}

std::vector<uint64_t> unsigned_shape(const Shape& shape) { return {shape.begin(), shape.end()}; }

Shape signed_shape(const std::vector<uint64_t>& shape) { return {shape.begin(), shape.end()}; }

// ---- loom -> Hugging Face -------------------------------------------------------------------

// The checkpoint's parameters must be exactly the config's model's, with the same shapes.
void check_parameters_match(const ckpt::LoadedCheckpoint& checkpoint, const std::vector<model::ParameterShape>& layout) {
  std::set<std::string> expected;
  for (const model::ParameterShape& p : layout) {
    expected.insert(p.name);
    LOOM_CHECK(checkpoint.has(p.name), "checkpoint " + checkpoint.path() + " has no tensor '" + p.name +
                                      "' that its config's model (manifest config_yaml) needs");
    const Shape stored = checkpoint.shape(p.name);
    LOOM_CHECK(stored == p.shape, "checkpoint " + checkpoint.path() + ": tensor '" + p.name + "' has shape " +
                                 shape_string(stored) + " but its config's model needs " + shape_string(p.shape));
    const DType dtype = checkpoint.dtype(p.name);
    LOOM_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
          "checkpoint " + checkpoint.path() + ": tensor '" + p.name + "' has dtype " + dtype_name(dtype) +
              "; parameters convert from f32, bf16 or f16");
  }
  for (const std::string& name : checkpoint.parameter_names()) {
    LOOM_CHECK(expected.count(name) != 0, "checkpoint " + checkpoint.path() + " holds parameter '" + name +
                                         "' that its config's model does not have; it cannot be mapped to config.json");
  }
}

// ---- Hugging Face -> loom -------------------------------------------------------------------

// The tensors of an HF model directory: one model.safetensors, or the shards of an index.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir) {
    const std::string single = (fs::path(dir) / kWeightsFile).string();
    const std::string index = (fs::path(dir) / kIndexFile).string();
    if (fs::exists(single)) {
      add_file(single);
      return;
    }
    LOOM_CHECK(fs::exists(index), dir + ": has neither " + kWeightsFile + " nor " + kIndexFile);
    read_index(dir, index);
  }

  const std::map<std::string, std::string>& metadata() const { return files_.front()->header().metadata; }
  // (file, tensor), or nulls when absent.
  std::pair<const loom::interop::hf::SafetensorsReader*, const loom::interop::hf::SafetensorsTensor*> find(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end()) return {nullptr, nullptr};
    return {it->second, &it->second->tensor(name)};
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, file] : where_) out.push_back(name);
    return out;
  }

 private:
  const loom::interop::hf::SafetensorsReader& add_file(const std::string& path) {
    files_.push_back(std::make_unique<loom::interop::hf::SafetensorsReader>(path));
    const loom::interop::hf::SafetensorsReader& file = *files_.back();
    for (const loom::interop::hf::SafetensorsTensor& t : file.header().tensors) {
      auto [it, inserted] = where_.emplace(t.name, &file);
      LOOM_CHECK(inserted, path + ": tensor '" + t.name + "' is also in " + it->second->path() +
                          " (each tensor must be in one file)");
    }
    return file;
  }

  // model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard file}}. The
  // shards must hold exactly the tensors the map gives them; shard names are plain file names
  // in the same directory (no paths, so an index cannot point outside it).
  void read_index(const std::string& dir, const std::string& index_path) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      throw Error(index_path + ": not valid JSON: " + e.what());
    }
    LOOM_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
          index_path + ": expected an object with a \"weight_map\" object (tensor name -> shard file)");
    std::map<std::string, std::set<std::string>> by_file;
    for (const auto& [name, file] : index.at("weight_map").items()) {
      LOOM_CHECK(file.is_string(), index_path + ": weight_map['" + name + "'] is not a file name");
      const std::string f = file.get<std::string>();
      LOOM_CHECK(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos && f.find('\0') == std::string::npos,
            index_path + ": weight_map['" + name + "'] = '" + f + "' is not a file name in " + dir);
      by_file[f].insert(name);
    }
    LOOM_CHECK(!by_file.empty(), index_path + ": weight_map is empty");
    for (const auto& [file, names] : by_file) {
      const loom::interop::hf::SafetensorsReader& shard = add_file((fs::path(dir) / file).string());
      for (const std::string& name : names) {
        LOOM_CHECK(shard.header().find(name) != nullptr,
              index_path + ": weight_map puts tensor '" + name + "' in " + file + ", which does not hold it");
      }
      for (const loom::interop::hf::SafetensorsTensor& t : shard.header().tensors) {
        LOOM_CHECK(names.count(t.name) != 0, shard.path() + ": holds tensor '" + t.name + "' that " + kIndexFile +
                                            " does not list in this file");
      }
    }
  }

  std::vector<std::unique_ptr<loom::interop::hf::SafetensorsReader>> files_;
  std::map<std::string, const loom::interop::hf::SafetensorsReader*> where_;
};

// Reads a float tensor as f32, checking its shape against `expected`.
std::vector<float> read_as_f32(const loom::interop::hf::SafetensorsReader& file, const loom::interop::hf::SafetensorsTensor& t,
                               const Shape& expected) {
  const std::string at = file.path() + ": tensor '" + t.name + "'";
  LOOM_CHECK(signed_shape(t.shape) == expected, at + " has shape " + shape_string(signed_shape(t.shape)) +
                                               " but config.json's model needs " + shape_string(expected));
  const std::optional<DType> dtype = float_dtype(t.dtype);
  LOOM_CHECK(dtype.has_value(), at + " has dtype " + t.dtype + "; parameters convert from F32, BF16 or F16");
  std::vector<std::byte> bytes(t.bytes());
  file.read(t, bytes);
  std::vector<float> out(t.numel());
  to_f32(out.data(), bytes.data(), static_cast<int64_t>(out.size()), *dtype);
  return out;
}

// Python's json module writes float('inf') as the bare word Infinity (Nemotron-H's
// time_step_limit), which is not JSON: outside strings, Infinity, -Infinity and NaN become the
// strings "Infinity", "-Infinity" and "NaN", which the config readers understand where they may appear.
std::string quote_python_floats(const std::string& text) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    in_string = c == '"';
    bool replaced = false;
    for (const std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (text.compare(i, word.size(), word) == 0) {
        out += '"';
        out += word;
        out += '"';
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

nlohmann::json read_config_json(const std::string& path) {
  LOOM_CHECK(fs::is_regular_file(path), path + ": missing (a Hugging Face model directory holds config.json)");
  try {
    return nlohmann::json::parse(quote_python_floats(read_file(path)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

// Old Llama exports carry RoPE's frequency table as a buffer; loom computes it from rope_theta.
bool is_rope_buffer(const std::string& name) {
  const std::string suffix = ".rotary_emb.inv_freq";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// data.tokenizer of an imported model (HfImportOptions::tokenizer says which wins).
std::string imported_tokenizer(const std::string& hf_dir, const std::string& out_root, const HfImportOptions& options,
                               const HfWeights& weights, const std::string& from_config) {
  if (!options.tokenizer.empty()) return options.tokenizer;
  if (!tokenizer_files_in(hf_dir).empty()) {
    // The model's own tokenizer travels with it (tokenizer_files.h).
    const std::string tokenizer_dir = fs::absolute(fs::path(out_root) / kTokenizerDir).lexically_normal().string();
    copy_tokenizer_files(hf_dir, tokenizer_dir);
    return std::string(kHfTokenizerPrefix) + tokenizer_dir;
  }
  if (options.config_path.empty() && weights.metadata().count(kTokenizerMetadata) != 0)
    return weights.metadata().at(kTokenizerMetadata);
  return from_config;
}

// The loom tensors of an HF directory, by loom name: every Hugging Face tensor the model needs,
// present with its shape and split into its pieces; then nothing else (old RoPE buffers and a
// tied head equal to the embedding aside).
struct ImportedTensors {
  std::map<std::string, std::vector<float>> values;
  std::vector<HfPiece> state;  // the state pieces (expert biases), in model order
};
ImportedTensors read_hf_tensors(const HfWeights& weights, const std::string& hf_dir, const config::ModelConfig& model) {
  ImportedTensors out;
  std::set<std::string> expected;
  std::string embedding;
  for (const HfTensor& t : hf_tensors(model)) {
    const auto [file, tensor] = weights.find(t.name);
    LOOM_CHECK(tensor != nullptr, hf_dir + ": no tensor '" + t.name + "' (shape " + shape_string(t.shape) +
                                     "), which the model in config.json needs");
    const std::vector<float> all = read_as_f32(*file, *tensor, t.shape);
    size_t at = 0;
    for (const HfPiece& piece : t.pieces) {
      const size_t n = static_cast<size_t>(shape_numel(piece.shape));
      out.values[piece.name].assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
      if (t.state) out.state.push_back(piece);
    }
    if (embedding.empty()) embedding = t.pieces.front().name;  // the first tensor is the embedding
    expected.insert(t.name);
  }
  for (const std::string& name : weights.names()) {
    if (expected.count(name) != 0 || is_rope_buffer(name)) continue;
    const auto [file, tensor] = weights.find(name);
    if (name == "lm_head.weight" && model.tied_embeddings) {
      // Some exporters write the tied head too; accept it only as the embedding's copy.
      const std::vector<float>& embed = out.values.at(embedding);
      const std::vector<float> head = read_as_f32(*file, *tensor, signed_shape(tensor->shape));
      LOOM_CHECK(head.size() == embed.size() && std::memcmp(head.data(), embed.data(), head.size() * sizeof(float)) == 0,
                 file->path() + ": tensor 'lm_head.weight' differs from the embedding, but config.json says "
                                "tie_word_embeddings: true");
      continue;
    }
    throw Error(file->path() + ": holds tensor '" + name +
                "' that the model in config.json does not have (a different architecture, or a config.json "
                "that does not match the weights)");
  }
  return out;
}

}  // namespace

HfExportResult export_to_hf(const std::string& checkpoint_path, const std::string& out_dir,
                            const HfExportOptions& options) {
  LOOM_CHECK(options.dtype == "f32" || options.dtype == "bf16",
        "--dtype '" + options.dtype + "' is not supported (valid: f32, bf16)");
  const ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  const config::RunConfig config =
      config::parse_config(checkpoint.config_yaml(), checkpoint.path() + "/manifest.json (config_yaml)", {});
  config::ModelConfig model = config.model;
  if (model.vocab_size == 0 && checkpoint.has("model.embed_tokens.weight")) {  // the tokenizer's, as trained
    model.vocab_size = static_cast<int>(checkpoint.shape("model.embed_tokens.weight").at(0));
  }
  check_hf_exportable(model);
  const std::vector<model::ParameterShape> layout = model::model_parameter_shapes(model);
  check_parameters_match(checkpoint, layout);

  const bool bf16 = options.dtype == "bf16";
  std::vector<loom::interop::hf::SafetensorsOutput> tensors;
  for (const HfTensor& t : hf_tensors(model)) {
    tensors.push_back({t.name, bf16 ? "BF16" : "F32", unsigned_shape(t.shape), [&checkpoint, t, bf16](std::span<std::byte> out) {
                         const std::vector<float> values = read_hf_tensor(checkpoint, t);
                         from_f32(out.data(), values.data(), static_cast<int64_t>(values.size()),
                                  bf16 ? DType::BF16 : DType::F32);
                       }});
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  LOOM_CHECK(!ec && fs::is_directory(out_dir), "cannot create output directory '" + out_dir + "': " + ec.message());
  // "format": "pt" is what transformers requires of a safetensors checkpoint it loads.
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {kTokenizerMetadata, config.data.tokenizer}};
  const std::string weights = (fs::path(out_dir) / kWeightsFile).string();
  loom::interop::hf::write_safetensors(weights, tensors, metadata);
  write_file_atomic((fs::path(out_dir) / kConfigFile).string(),
                    hf_config_json(model, bf16 ? "bfloat16" : "float32").dump(2) + "\n");
  if (is_hf_tokenizer_name(config.data.tokenizer))
    copy_tokenizer_files(config.data.tokenizer.substr(std::string_view(kHfTokenizerPrefix).size()), out_dir);

  HfExportResult result;
  result.checkpoint = checkpoint.path();
  result.step = checkpoint.step();
  result.architecture = architecture_of(model);
  result.tensors = tensors.size();
  result.bytes = fs::file_size(weights);
  return result;
}

HfImportResult import_from_hf(const std::string& hf_dir, const std::string& out_root, const HfImportOptions& options) {
  LOOM_CHECK(fs::is_directory(hf_dir), "'" + hf_dir + "' is not a directory (expected a Hugging Face model directory)");
  if (fs::exists(out_root)) {
    LOOM_CHECK(fs::is_directory(out_root) && fs::is_empty(out_root),
          "output '" + out_root + "' already exists and is not an empty directory; give a new checkpoint root");
  }
  const std::string config_path = (fs::path(hf_dir) / kConfigFile).string();
  config::RunConfig run = options.config_path.empty() ? config::RunConfig{}
                                                       : config::load_config(options.config_path, {});
  run.model = model_config_from_hf(read_config_json(config_path), config_path);
  const HfWeights weights(hf_dir);
  run.data.tokenizer = imported_tokenizer(hf_dir, out_root, options, weights, run.data.tokenizer);
  if (options.config_path.empty()) run.data.seq_len = std::min(run.data.seq_len, run.model.max_seq_len);
  try {
    config::validate_config(run);
  } catch (const Error& e) {
    throw Error("converting " + hf_dir + ": the resulting loom run config is not valid: " + e.what());
  }
  const int32_t tokenizer_vocab = is_hf_tokenizer_name(run.data.tokenizer)
                                      ? data::make_tokenizer(run.data.tokenizer)->vocab_size()
                                      : known_tokenizer_vocab_size(run.data.tokenizer);
  LOOM_CHECK(run.model.vocab_size >= tokenizer_vocab,
             config_path + ": vocab_size is " + std::to_string(run.model.vocab_size) + " but tokenizer '" +
                 run.data.tokenizer + "' has " + std::to_string(tokenizer_vocab) +
                 " ids; the model could not embed its tokens. Give --tokenizer one whose vocabulary fits (at most " +
                 std::to_string(run.model.vocab_size) + " ids; byte has 256)");

  // Every parameter present with its shape; then nothing else.
  const std::vector<model::ParameterShape> layout = model::model_parameter_shapes(run.model);
  const ImportedTensors imported = read_hf_tensors(weights, hf_dir, run.model);

  // Parameters and zero AdamW moments, as a training save writes them; the expert biases as the
  // trainer's state tensors.
  size_t largest = 0;
  for (const auto& [name, v] : imported.values) largest = std::max(largest, v.size());
  const std::vector<float> zeros(largest, 0.0f);
  std::vector<ckpt::TensorRef> refs;
  for (const model::ParameterShape& p : layout) {
    ckpt::check_tensor_name(p.name);
    refs.push_back({p.name, p.shape, DType::F32, imported.values.at(p.name).data(), {}});
    refs.push_back({ckpt::optimizer_state_name("exp_avg", p.name), p.shape, DType::F32, zeros.data(), {}});
    refs.push_back({ckpt::optimizer_state_name("exp_avg_sq", p.name), p.shape, DType::F32, zeros.data(), {}});
  }
  if (run.model.moe.expert_bias) {
    for (const HfPiece& piece : imported.state) refs.push_back({piece.name, piece.shape, DType::F32,
                                                                imported.values.at(piece.name).data(), ckpt::full_slice(piece.shape)});
  }
  const train::TrainingProgress progress;  // step 0, no samples consumed
  ckpt::save_checkpoint(out_root, progress.step, refs, train::training_state(progress, run), config::to_yaml(run),
                        /*keep=*/0);

  HfImportResult result;
  result.checkpoint = (fs::path(out_root) / ckpt::step_dir_name(progress.step)).string();
  result.architecture = architecture_of(run.model);
  result.tensors = layout.size();
  result.tokenizer = run.data.tokenizer;
  return result;
}

}  // namespace loom::interop::hf
