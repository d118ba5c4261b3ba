// SentencePiece's tokenizer.model through libsentencepiece.
#include <sentencepiece_processor.h>

#include <charconv>
#include <filesystem>
#include <system_error>

#include "loom/core/error.h"
#include "loom/data/hf/pipelines.h"

namespace loom::data::hf {

namespace {

class SentencePiecePipeline final : public HfPipeline {
 public:
  explicit SentencePiecePipeline(const std::string& path) {
    auto status = processor_.Load(path);
    if (!status.ok()) throw Error(path + ": SentencePiece cannot load it: " + status.ToString());
  }

  std::string normalize(std::string_view text) const override { return std::string(text); }

  // SentencePiece normalizes and adds its own prefix space (the model's normalizer spec).
  void encode_normalized(std::string_view text, bool first, std::vector<int32_t>& out) const override {
    (void)first;
    std::vector<int> ids;
    auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw Error("SentencePiece encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode(const std::vector<int32_t>& ids, const AddedTokens& added) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      std::string text;
      auto status = processor_.Decode(run, &text);
      if (!status.ok()) throw Error("SentencePiece decode failed: " + status.ToString());
      out += text;
      run.clear();
    };
    for (size_t i = 0; i < ids.size(); ++i) {
      if (const AddedToken* a = added.by_id(ids[i])) {
        flush();
        out += a->content;
        continue;
      }
      if (ids[i] < 0 || ids[i] >= model_vocab_size())
        throw Error("tokenizer: cannot decode id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                    "; valid ids are 0.." + std::to_string(model_vocab_size() - 1));
      run.push_back(ids[i]);
    }
    flush();
    return out;
  }

  std::optional<int32_t> token_id(std::string_view token) const override {
    const int id = processor_.PieceToId(token);
    if (id == processor_.unk_id() && token != processor_.IdToPiece(id)) return std::nullopt;
    return id;
  }
  int32_t model_vocab_size() const override { return processor_.GetPieceSize(); }

  const sentencepiece::SentencePieceProcessor& processor() const { return processor_; }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

namespace {

// A key of tokenizer_config.json's (`file`) added_tokens_decoder: the token's id, a non-negative integer.
int added_token_id(const std::string& key, const std::string& file) {
  int id = -1;
  const char* end = key.data() + key.size();
  const auto [stop, error] = std::from_chars(key.data(), end, id);
  LOOM_CHECK(error == std::errc() && stop == end && id >= 0,
             file + ": added_tokens_decoder key '" + key + "' is not a token id (a non-negative integer)");
  return id;
}

// A true/false key of `object` (where: the file and the object's path, ending in '.'); absent or
// null is `fallback`.
bool flag(const nlohmann::json& object, const char* key, bool fallback, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  LOOM_CHECK(it->is_boolean(), where + key + " is a JSON " + it->type_name() + "; expected true or false");
  return it->get<bool>();
}

// One entry of tokenizer_config.json's added_tokens_decoder: {"content": "<s>", "special": true, ...}.
AddedToken added_token(const std::string& key, const nlohmann::json& entry, const std::string& file) {
  const std::string where = file + ": added_tokens_decoder['" + key + "']";
  LOOM_CHECK(entry.is_object(), where + " is a JSON " + entry.type_name() + "; expected an object such as "
                                "{\"content\": \"<s>\", \"special\": true}");
  const auto content = entry.find("content");
  const std::string found = content == entry.end() ? "missing" : "a JSON " + std::string(content->type_name());
  LOOM_CHECK(content != entry.end() && content->is_string(),
             where + ".content is " + found + "; expected the token's text (a string)");
  const std::string at = where + ".";
  return {content->get<std::string>(), added_token_id(key, file), flag(entry, "special", false, at),
          flag(entry, "normalized", false, at), flag(entry, "lstrip", false, at), flag(entry, "rstrip", false, at)};
}

}  // namespace

std::unique_ptr<HfPipeline> load_sentencepiece(const std::string& path, const nlohmann::json& config, AddedTokens& added) {
  auto pipeline = std::make_unique<SentencePiecePipeline>(path);
  const auto& sp = pipeline->processor();
  // Control pieces (<s>, </s>) are written in text only as added tokens; SentencePiece itself
  // never produces them from text.
  for (int id = 0; id < sp.GetPieceSize(); ++id)
    if (sp.IsControl(id) && !sp.IdToPiece(id).empty()) added.add({sp.IdToPiece(id), id, true, false, false, false});
  const std::string file = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  const auto decoder = config.find("added_tokens_decoder");
  if (decoder != config.end() && !decoder->is_null()) {
    LOOM_CHECK(decoder->is_object(), file + ": added_tokens_decoder is a JSON " + decoder->type_name() +
                                         "; expected an object of token id -> token");
    for (const auto& [id, t] : decoder->items()) added.add(added_token(id, t, file));
  }
  const std::string top = file + ": ";
  if (flag(config, "add_bos_token", true, top) && sp.bos_id() >= 0) pipeline->prefix_ids.push_back(sp.bos_id());
  if (flag(config, "add_eos_token", false, top) && sp.eos_id() >= 0) pipeline->suffix_ids.push_back(sp.eos_id());
  return pipeline;
}

}  // namespace loom::data::hf
