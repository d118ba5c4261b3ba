#include "loom/data/hf/bpe_model.h"

#include <cstdio>
#include <queue>

#include "loom/core/error.h"
#include "loom/data/hf/components.h"

namespace loom::data::hf {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
}

struct Candidate {
  int32_t rank;
  uint32_t position;
  int32_t left, right;  // the ids the pair had when queued
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : position > o.position; }
};

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, bool byte_level, const std::string& file) : byte_level_(byte_level) {
  auto option = [&](const char* key) {
    auto it = model.find(key);
    if (it == model.end() || it->is_null()) return false;
    LOOM_CHECK(it->is_boolean(),
               file + ": model." + key + " is a JSON " + it->type_name() + "; expected true or false");
    return it->get<bool>();
  };
  ignore_merges_ = option("ignore_merges");
  byte_fallback_ = option("byte_fallback");
  fuse_unk_ = option("fuse_unk");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0)
    throw Error(file + ": BPE dropout is not supported (tokenization must be deterministic)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      throw Error(file + ": BPE " + key + " is not supported (used by WordPiece-style BPE, not by byte-level or "
                         "SentencePiece-converted files)");
  LOOM_CHECK(model.contains("vocab") && model["vocab"].is_object(), file + ": model.vocab must be an object of token -> id");
  std::string bytes;
  // Ids index the token table: one far past the vocabulary's entries is not a vocabulary id (it
  // would size the table, and the model's embedding, by itself).
  const int64_t entries = static_cast<int64_t>(model["vocab"].size()), id_limit = entries + 65536;
  for (const auto& [text, id_json] : model["vocab"].items()) {
    LOOM_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0,
               file + ": model.vocab['" + text + "'] must be a non-negative integer id");
    LOOM_CHECK(id_json.get<int64_t>() < id_limit,
               file + ": model.vocab['" + text + "'] = " + id_json.dump() + " is far past the vocabulary's " +
                   std::to_string(entries) + " entries (ids must be below " + std::to_string(id_limit) + ")");
    const auto id = id_json.get<int32_t>();
    std::string key = byte_level_ && byte_level_decode(text, bytes) ? bytes : text;
    if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1);
    tokens_[static_cast<size_t>(id)] = key;
    vocab_[key] = id;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab_.find(model["unk_token"].get<std::string>());
    LOOM_CHECK(it != vocab_.end(), file + ": model.unk_token '" + model["unk_token"].get<std::string>() + "' is not in the vocabulary");
    unk_ = it->second;
  }
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(byte_level_ ? std::string(1, static_cast<char>(b)) : std::string(name));
    if (it != vocab_.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  load_merges(model.value("merges", nlohmann::json::array()), file);
}

void BpeModel::load_merges(const nlohmann::json& merges, const std::string& file) {
  LOOM_CHECK(merges.is_array(), file + ": model.merges must be a list");
  merges_.reserve(merges.size());
  std::string left, right, bytes;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      LOOM_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                 file + ": merge " + std::to_string(rank) + " '" + s + "' must be two tokens separated by one space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      LOOM_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                 file + ": merge " + std::to_string(rank) + " must be \"a b\" or [\"a\", \"b\"]");
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    if (byte_level_) {
      if (byte_level_decode(left, bytes)) left = bytes;
      if (byte_level_decode(right, bytes)) right = bytes;
    }
    auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
    LOOM_CHECK(l != vocab_.end() && r != vocab_.end() && merged != vocab_.end(),
               file + ": merge " + std::to_string(rank) + " uses a token missing from the vocabulary");
    merges_.emplace(pair_key(l->second, r->second), Merge{static_cast<int32_t>(rank), merged->second});
  }
}

std::optional<BpeModel::Merge> BpeModel::merge_of(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  if (it == merges_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::id_of(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::token(int32_t id) const {
  static const std::string none;
  return id >= 0 && id < size() ? tokens_[static_cast<size_t>(id)] : none;
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
  bool last_unknown = false;
  for (size_t i = 0; i < piece.size();) {
    // Byte-level pieces start from single bytes; others from characters.
    const size_t n = byte_level_ ? 1 : std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
    std::string_view ch = piece.substr(i, n);
    i += n;
    if (auto it = vocab_.find(std::string(ch)); it != vocab_.end()) {
      symbols.push_back(it->second);
      last_unknown = false;
      continue;
    }
    bool bytes_known = byte_fallback_;
    for (char c : ch) bytes_known = bytes_known && byte_ids_[static_cast<unsigned char>(c)] >= 0;
    if (bytes_known) {
      for (char c : ch) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      last_unknown = false;
      continue;
    }
    LOOM_CHECK(unk_ >= 0, "BPE: '" + std::string(ch) + "' is not in the vocabulary and the model has no unk_token");
    if (!(fuse_unk_ && last_unknown)) symbols.push_back(unk_);
    last_unknown = true;
  }
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_)
    if (auto it = vocab_.find(std::string(piece)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  std::vector<int32_t> ids;
  initial_symbols(piece, ids);
  const auto n = static_cast<uint32_t>(ids.size());
  std::vector<uint32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;  // n: none
    prev[i] = i - 1;  // UINT32_MAX: none
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](uint32_t at) {
    if (at == UINT32_MAX || next[at] >= n) return;
    if (auto m = merge_of(ids[at], ids[next[at]])) heap.push({m->rank, at, ids[at], ids[next[at]]});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale once either symbol changed since the pair was queued.
    if (!alive[c.position] || next[c.position] >= n || ids[c.position] != c.left || ids[next[c.position]] != c.right) continue;
    const uint32_t right = next[c.position];
    ids[c.position] = merge_of(c.left, c.right)->id;
    alive[right] = false;
    next[c.position] = next[right];
    if (next[right] < n) prev[next[right]] = c.position;
    push(prev[c.position]);
    push(c.position);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out.push_back(ids[i]);
}

}  // namespace loom::data::hf
