// SentencePiece's tokenizer.model through libsentencepiece.
#include <sentencepiece_processor.h>

#include <charconv>
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

// A key of tokenizer_config.json's added_tokens_decoder: the token's id, a non-negative integer.
int added_token_id(const std::string& key) {
  int id = -1;
  const char* end = key.data() + key.size();
  const auto [stop, error] = std::from_chars(key.data(), end, id);
  LOOM_CHECK(error == std::errc() && stop == end && id >= 0, "tokenizer_config.json: added_tokens_decoder key '" + key +
                                                                 "' is not a token id (a non-negative integer)");
  return id;
}

}  // namespace

std::unique_ptr<HfPipeline> load_sentencepiece(const std::string& path, const nlohmann::json& config, AddedTokens& added) {
  auto pipeline = std::make_unique<SentencePiecePipeline>(path);
  const auto& sp = pipeline->processor();
  // Control pieces (<s>, </s>) are written in text only as added tokens; SentencePiece itself
  // never produces them from text.
  for (int id = 0; id < sp.GetPieceSize(); ++id)
    if (sp.IsControl(id) && !sp.IdToPiece(id).empty()) added.add({sp.IdToPiece(id), id, true, false, false, false});
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object())
    for (const auto& [id, t] : config["added_tokens_decoder"].items())
      added.add({t.value("content", std::string()), added_token_id(id), t.value("special", false),
                 t.value("normalized", false), t.value("lstrip", false), t.value("rstrip", false)});
  if (config.value("add_bos_token", true) && sp.bos_id() >= 0) pipeline->prefix_ids.push_back(sp.bos_id());
  if (config.value("add_eos_token", false) && sp.eos_id() >= 0) pipeline->suffix_ids.push_back(sp.eos_id());
  return pipeline;
}

}  // namespace loom::data::hf
