// tokenizer.json: normalizer -> pre-tokenizer -> BPE model, post-processor, decoder.
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/hf/bpe_model.h"
#include "loom/data/hf/components.h"
#include "loom/data/hf/pipelines.h"

namespace loom::data::hf {

namespace {

// read() of one top-level section of the file: a value of the wrong JSON type inside it is an
// error naming the file and the section.
template <typename Read>
auto in_section(const std::string& file, const char* section, Read read) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": '" + section + "' has an unexpected structure: " + e.what());
  }
}

class JsonPipeline final : public HfPipeline {
 public:
  JsonPipeline(const nlohmann::json& spec, const std::string& file)
      : normalizer_(in_section(file, "normalizer",
                               [&] { return make_normalizer(spec.value("normalizer", nlohmann::json()), file); })),
        pre_tokenizer_(in_section(file, "pre_tokenizer", [&] {
          return make_pre_tokenizer(spec.value("pre_tokenizer", nlohmann::json()), file, byte_level_);
        })),
        model_(in_section(file, "model", [&] { return BpeModel(model_spec(spec, file), byte_level_, file); })),
        decoder_(in_section(file, "decoder",
                            [&] { return make_decoder(spec.value("decoder", nlohmann::json()), file); })) {}

  void encode_normalized(std::string_view text, bool first, std::vector<int32_t>& out) const override {
    std::vector<Piece> pieces = {{std::string(text), first}};
    pre_tokenizer_->apply(pieces);
    for (const Piece& p : pieces) model_.encode(p.text, out);
  }
  std::string normalize(std::string_view text) const override { return normalizer_(std::string(text)); }

  std::string decode(const std::vector<int32_t>& ids, const AddedTokens& added) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (const AddedToken* a = added.by_id(ids[i])) {
        tokens.push_back(a->content);
        continue;
      }
      const std::string& t = model_.token(ids[i]);
      if (t.empty()) throw Error("tokenizer: cannot decode id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                 "; it is neither in the vocabulary nor an added token");
      tokens.push_back(t);
    }
    decoder_(tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }
  std::optional<int32_t> token_id(std::string_view token) const override { return model_.id_of(token); }
  int32_t model_vocab_size() const override { return model_.size(); }

 private:
  static const nlohmann::json& model_spec(const nlohmann::json& spec, const std::string& file) {
    LOOM_CHECK(spec.contains("model") && spec["model"].is_object(), file + ": no 'model' object");
    const nlohmann::json& model = spec["model"];
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") unsupported("model", model, file, "BPE (Llama 3, Qwen 2/3, SentencePiece-converted BPE files)");
    return model;
  }

  bool byte_level_ = false;
  Normalizer normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  BpeModel model_;
  Decoder decoder_;
};

// TemplateProcessing's `single` as ids before and after the sequence; ByteLevel adds nothing.
void read_post_processor(const nlohmann::json& spec, const std::string& file, HfPipeline& pipeline, const AddedTokens& added) {
  if (spec.is_null()) return;
  const char* kSupported = "TemplateProcessing, ByteLevel, Sequence";
  const std::string type = spec.is_object() ? spec.value("type", std::string()) : "";
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& step : spec.value("processors", nlohmann::json::array())) read_post_processor(step, file, pipeline, added);
    return;
  }
  if (type != "TemplateProcessing") unsupported("post-processor", spec, file, kSupported);
  bool after = false;
  for (const auto& item : spec.value("single", nlohmann::json::array())) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    LOOM_CHECK(item.contains("SpecialToken"), file + ": TemplateProcessing items must be SpecialToken or Sequence");
    const std::string name = item["SpecialToken"].value("id", std::string());
    const auto& specials = spec.value("special_tokens", nlohmann::json::object());
    LOOM_CHECK(specials.contains(name) && specials[name].contains("ids"),
               file + ": TemplateProcessing names special token '" + name + "' without ids in special_tokens");
    for (const auto& id : specials[name]["ids"]) (after ? pipeline.suffix_ids : pipeline.prefix_ids).push_back(id.get<int32_t>());
  }
}

}  // namespace

std::unique_ptr<HfPipeline> load_tokenizer_json(const std::string& path, AddedTokens& added) {
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not valid JSON: " + e.what());
  }
  LOOM_CHECK(spec.is_object(), path + " must hold a JSON object");
  in_section(path, "added_tokens", [&] {
    for (const auto& t : spec.value("added_tokens", nlohmann::json::array())) {
      if (t.value("single_word", false)) throw Error(path + ": added token " + t.dump() + " sets single_word, which is not supported");
      const nlohmann::json& id = t.at("id");
      LOOM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 30),
                 path + ": added token " + t.dump() + " needs an id that is a non-negative integer below 2^30");
      added.add({t.at("content").get<std::string>(), id.get<int32_t>(), t.value("special", false),
                 t.value("normalized", false), t.value("lstrip", false), t.value("rstrip", false)});
    }
  });
  auto pipeline = std::make_unique<JsonPipeline>(spec, path);
  in_section(path, "post_processor",
             [&] { read_post_processor(spec.value("post_processor", nlohmann::json()), path, *pipeline, added); });
  return pipeline;
}

}  // namespace loom::data::hf
