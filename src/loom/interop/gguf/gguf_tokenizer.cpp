#include "loom/interop/gguf/gguf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/hf/components.h"
#include "loom/data/hf/hf_tokenizer.h"
#include "loom/interop/gguf/tiktoken_merges.h"

namespace loom::interop::gguf {

namespace {
// llama.cpp's token types (llama_token_type).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// The pre-tokenizer regexes of Llama 3 and Qwen 2 as their tokenizer.json files spell them, which
// llama.cpp runs as its "llama-bpe" and "qwen2" pre-tokenizers.
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Vocabulary {
  std::string pre;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  int32_t bos = 0, eos = 0;
};

[[noreturn]] void refuse(const std::string& key, const std::string& value, const std::string& valid) {
  throw Error("loom convert --to-gguf: " + key + " is " + value + "; " + valid);
}

std::string byte_level(const std::string& bytes) {
  std::string text;
  for (unsigned char b : bytes) text += data::hf::byte_level_char(b);
  return text;
}

void set_token(Vocabulary& v, int64_t id, const std::string& text, int32_t type) {
  if (id >= static_cast<int64_t>(v.tokens.size())) {
    v.tokens.resize(static_cast<size_t>(id) + 1);
    v.types.resize(static_cast<size_t>(id) + 1, kUnused);
  }
  v.tokens[static_cast<size_t>(id)] = text;
  v.types[static_cast<size_t>(id)] = type;
}

// Byte tokenizer: every byte its own id and no merges, so llama.cpp's BPE never merges.
Vocabulary byte_vocabulary(const data::Tokenizer& tokenizer) {
  Vocabulary v{"default", {}, {}, {}, tokenizer.eot_token(), tokenizer.eot_token()};
  for (int b = 0; b < 256; ++b) set_token(v, b, data::hf::byte_level_char(static_cast<unsigned char>(b)), kNormal);
  return v;
}

// llama.cpp's pre-tokenizer splitting text as a tiktoken encoding's pattern does: GPT-2's for
// r50k_base (gpt2) and p50k_base; cl100k_base's is Llama 3's (whose tokenizer extends it), which
// llama.cpp runs as "llama-bpe", taking a piece found whole in the vocabulary as tiktoken does;
// o200k_base's is llama.cpp's "gpt-4o".
std::string tiktoken_pre(const std::string& encoding) {
  if (encoding == "r50k_base" || encoding == "p50k_base" || encoding == "p50k_edit") return "gpt-2";
  if (encoding == "cl100k_base") return "llama-bpe";
  if (encoding == "o200k_base") return "gpt-4o";
  return "";
}

// A tiktoken encoding (data/bpe_tokenizer.h): each rank's bytes as byte-to-unicode characters at
// its id, its special tokens (control) at theirs, unused ids between them marked unused, and the
// merges rebuilt from the ranks in rank order (tiktoken_merges.h).
Vocabulary tiktoken_vocabulary(const data::BpeTokenizer& tokenizer) {
  const std::string encoding(tokenizer.encoding().name);
  Vocabulary v{tiktoken_pre(encoding), {}, {}, {}, tokenizer.eot_token(), tokenizer.eot_token()};
  if (v.pre.empty())
    refuse("data.tokenizer", encoding, "the GGUF export takes the tiktoken encodings r50k_base (gpt2), p50k_base, "
                                       "p50k_edit, cl100k_base and o200k_base");
  std::vector<std::string> ranks;  // in rank order: the ids of the ranks ascend with them
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::optional<std::string_view> bytes = tokenizer.rank_bytes(id);
    if (!bytes) continue;
    ranks.emplace_back(*bytes);
    set_token(v, id, byte_level(ranks.back()), kNormal);
  }
  for (const data::SpecialToken& s : tokenizer.encoding().specials) set_token(v, s.id, std::string(s.text), kControl);
  for (auto& [left, right] : merges_from_ranks(ranks)) v.merges.push_back(byte_level(left) + " " + byte_level(right));
  return v;
}

// llama.cpp's pre-tokenizer for tokenizer.json's, or "" when it has none that splits the same.
std::string pre_name(const nlohmann::json& pre) {
  // A null (no pre-tokenizer, or a null step of a Sequence) splits as none of them.
  auto byte_level_step = [](const nlohmann::json& s, bool use_regex) {
    return s.is_object() && s.value("type", "") == "ByteLevel" && !s.value("add_prefix_space", true) &&
           s.value("use_regex", true) == use_regex;
  };
  if (byte_level_step(pre, true)) return "gpt-2";
  if (!pre.is_object() || pre.value("type", "") != "Sequence" || !pre.contains("pretokenizers") ||
      !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 2)
    return "";
  const nlohmann::json& split = pre["pretokenizers"][0];
  if (!split.is_object() || split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
      split.value("invert", true) || !byte_level_step(pre["pretokenizers"][1], false))
    return "";
  const std::string regex = split.value("pattern", nlohmann::json::object()).value("Regex", "");
  return regex == kLlama3Regex ? "llama-bpe" : regex == kQwen2Regex ? "qwen2" : "";
}

// hf:<dir>: tokenizer.json's vocabulary, merges and added tokens as they are (its token strings
// are already byte-level), checked to be a pipeline llama.cpp's BPE reproduces.
Vocabulary hf_vocabulary(const std::string& name, const data::HfTokenizer& tokenizer) {
  const std::string file = tokenizer.source_file();
  if (std::filesystem::path(file).filename() != "tokenizer.json")
    refuse("data.tokenizer", name + " (SentencePiece " + file + ")", "the GGUF export takes byte-level BPE tokenizer.json files");
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  LOOM_CHECK(!j.is_discarded(), file + ": not valid JSON");
  const nlohmann::json& model = j.at("model");
  const std::string where = file + ": ";
  if (model.value("type", "") != "BPE")
    refuse(where + "model.type", model.value("type", "(none)"), "the GGUF export takes BPE");
  // A flag HfTokenizer has checked: true or false, or absent or null for false.
  auto flag = [&](const char* key) { return model.contains(key) && model[key].is_boolean() && model[key].get<bool>(); };
  if (flag("byte_fallback"))
    refuse(where + "model.byte_fallback", "true", "the GGUF export takes byte-level BPE (a ByteLevel pre-tokenizer)");
  const nlohmann::json normalizer = j.value("normalizer", nlohmann::json());
  if (!normalizer.is_null() && normalizer.value("type", "") != "NFC")
    refuse(where + "normalizer", normalizer.dump(), "llama.cpp normalizes nothing (null, or NFC for text already in NFC)");
  Vocabulary v;
  v.pre = pre_name(j.value("pre_tokenizer", nlohmann::json()));
  if (v.pre.empty())
    refuse(where + "pre_tokenizer", j.value("pre_tokenizer", nlohmann::json()).dump(),
           "llama.cpp's pre-tokenizers exported are GPT-2's ByteLevel (use_regex) and the Llama 3 and Qwen 2 Split regexes "
           "followed by ByteLevel");
  const nlohmann::json decoder = j.value("decoder", nlohmann::json());
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel")
    refuse(where + "decoder", decoder.dump(), "the GGUF export takes the ByteLevel decoder");
  // llama.cpp ignores merges (takes a whole piece found in the vocabulary) exactly for llama-bpe.
  if (flag("ignore_merges") != (v.pre == "llama-bpe"))
    refuse(where + "model.ignore_merges", flag("ignore_merges") ? "true" : "false",
           "llama.cpp's " + v.pre + " pre-tokenizer implies " + (v.pre == "llama-bpe" ? "true" : "false"));
  for (const auto& [token, id] : model.at("vocab").items()) set_token(v, id.get<int64_t>(), token, kNormal);
  for (const nlohmann::json& t : j.value("added_tokens", nlohmann::json::array()))
    set_token(v, t.at("id").get<int64_t>(), t.at("content").get<std::string>(), t.value("special", false) ? kControl : kUserDefined);
  for (const nlohmann::json& m : model.value("merges", nlohmann::json::array()))  // absent: none, as HfTokenizer reads
    v.merges.push_back(m.is_array() ? m.at(0).get<std::string>() + " " + m.at(1).get<std::string>() : m.get<std::string>());
  v.eos = tokenizer.eot_token();
  v.bos = tokenizer.bos_token() >= 0 ? tokenizer.bos_token() : v.eos;
  return v;
}
}  // namespace

void add_tokenizer(GgufWriter& w, int64_t vocab_size, const std::string& name, const data::Tokenizer& tokenizer) {
  Vocabulary v;
  if (name == "byte") {
    v = byte_vocabulary(tokenizer);
  } else if (const auto* tiktoken = dynamic_cast<const data::BpeTokenizer*>(&tokenizer)) {
    v = tiktoken_vocabulary(*tiktoken);
  } else if (const auto* hf = dynamic_cast<const data::HfTokenizer*>(&tokenizer)) {
    v = hf_vocabulary(name, *hf);
  } else {
    refuse("data.tokenizer", name, "the GGUF export takes byte, the tiktoken encodings and hf:<dir> byte-level BPE "
                                   "tokenizers");
  }
  LOOM_CHECK(static_cast<int64_t>(v.tokens.size()) <= vocab_size,
             "loom convert --to-gguf: tokenizer " + name + " has ids up to " + std::to_string(v.tokens.size() - 1) +
                 ", past model.vocab_size " + std::to_string(vocab_size));
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] == kUnused) v.tokens[i] = "<unused" + std::to_string(i) + ">";
  }
  for (int64_t i = static_cast<int64_t>(v.tokens.size()); i < vocab_size; ++i) set_token(v, i, "<unused" + std::to_string(i) + ">", kUnused);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", v.pre);
  w.add_strings("tokenizer.ggml.tokens", v.tokens);
  w.add_i32s("tokenizer.ggml.token_type", v.types);
  w.add_strings("tokenizer.ggml.merges", v.merges);
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
  w.add_bool("tokenizer.ggml.add_bos_token", false);  // loom adds nothing unless asked
}

}  // namespace loom::interop::gguf
