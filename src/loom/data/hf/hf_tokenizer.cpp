#include "loom/data/hf/hf_tokenizer.h"

#include <filesystem>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/chat_template/chat_template.h"
#include "loom/data/hf/pipelines.h"

namespace loom::data {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_config(const fs::path& path) {
  if (!fs::is_regular_file(path)) return nlohmann::json::object();
  try {
    nlohmann::json config = nlohmann::json::parse(read_file(path.string()));
    LOOM_CHECK(config.is_object(), path.string() + " must hold a JSON object");
    return config;
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + " is not valid JSON: " + e.what());
  }
}

// bos_token / eos_token of tokenizer_config.json (`file`): a string or {"content": ...}; absent or null: none.
std::string config_token(const nlohmann::json& config, const char* key, const std::string& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  throw Error(file + ": " + key + " is " + (it->is_object() ? "an object without a string 'content'" :
                                             "a JSON " + std::string(it->type_name())) +
              "; expected the token's text, {\"content\": text} or null");
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& dir) : dir_(dir), name_(std::string(kHfTokenizerPrefix) + dir) {
  LOOM_CHECK(fs::is_directory(dir), "tokenizer " + name_ + ": " + dir + " is not a directory (hf:<dir> names a Hugging "
                                    "Face tokenizer directory holding tokenizer.json or tokenizer.model)");
  const fs::path json_path = fs::path(dir) / "tokenizer.json";
  const fs::path model_path = fs::path(dir) / "tokenizer.model";
  const nlohmann::json config = read_config(fs::path(dir) / "tokenizer_config.json");
  if (fs::is_regular_file(json_path)) {
    source_file_ = json_path.string();
    pipeline_ = hf::load_tokenizer_json(source_file_, added_);
  } else if (fs::is_regular_file(model_path)) {
    source_file_ = model_path.string();
    pipeline_ = hf::load_sentencepiece(source_file_, config, added_);
  } else {
    throw Error("tokenizer " + name_ + ": " + dir + " has neither tokenizer.json nor tokenizer.model");
  }
  vocab_size_ = std::max(pipeline_->model_vocab_size(), added_.max_id() + 1);
  auto id_of = [&](const std::string& text) -> int32_t {
    if (text.empty()) return -1;
    if (auto id = special_token_id(text)) return *id;
    throw Error(dir + "/tokenizer_config.json names '" + text + "', which " + source_file_ + " has no token for");
  };
  const std::string config_file = (fs::path(dir) / "tokenizer_config.json").string();
  bos_ = id_of(config_token(config, "bos_token", config_file));
  eos_ = id_of(config_token(config, "eos_token", config_file));
  if (eos_ < 0)
    for (const char* fallback : {"<|endoftext|>", "</s>", "<|end_of_text|>"})
      if (auto id = special_token_id(fallback)) {
        eos_ = *id;
        break;
      }
  if (eos_ < 0) eos_ = 0;
}

HfTokenizer::~HfTokenizer() = default;

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  return encode(text, EncodeOptions{.parse_special = false, .add_special_tokens = false});
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids = pipeline_->prefix_ids;
  bool first = true;
  for (const Segment& raw : added_.segments(text, false, options.parse_special)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      first = false;
      continue;
    }
    const std::string normalized = pipeline_->normalize(raw.text);
    if (!added_.any_normalized()) {
      pipeline_->encode_normalized(normalized, first, ids);
    } else {
      for (const Segment& part : added_.segments(normalized, true, options.parse_special)) {
        if (part.id >= 0) ids.push_back(part.id);
        else pipeline_->encode_normalized(part.text, first, ids);
      }
    }
    first = false;
  }
  if (options.add_special_tokens) ids.insert(ids.end(), pipeline_->suffix_ids.begin(), pipeline_->suffix_ids.end());
  return ids;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  return pipeline_->decode(std::vector<int32_t>(ids.begin(), ids.end()), added_);
}

std::optional<int32_t> HfTokenizer::special_token_id(std::string_view text) const {
  if (auto id = added_.id_of(text)) return id;
  return pipeline_->token_id(text);
}

std::shared_ptr<const ChatTemplate> HfTokenizer::chat_template(const std::string& name) const {
  return load_chat_template((fs::path(dir_) / "tokenizer_config.json").string(), name);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir) {
  return std::make_unique<HfTokenizer>(dir);
}

}  // namespace loom::data
