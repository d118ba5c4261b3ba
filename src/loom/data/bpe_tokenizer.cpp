#include "loom/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <openssl/evp.h>
#include <pcre2.h>

#include <array>
#include <charconv>
#include <climits>
#include <filesystem>
#include <queue>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::data {

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";
constexpr std::string_view kFimPrefix = "<|fim_prefix|>";
constexpr std::string_view kFimMiddle = "<|fim_middle|>";
constexpr std::string_view kFimSuffix = "<|fim_suffix|>";
constexpr std::string_view kEndOfPrompt = "<|endofprompt|>";

// Split patterns as tiktoken publishes them.
constexpr std::string_view kR50kPattern =
    R"re('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)re";
constexpr std::string_view kCl100kPattern =
    R"re('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)re";
constexpr std::string_view kO200kPattern =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)re"
    R"re(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)re"
    R"re(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

const std::vector<BpeEncoding>& encodings() {
  static const std::vector<BpeEncoding> all = {
      {"r50k_base", "r50k_base.tiktoken",
       "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", kR50kPattern,
       {{kEndOfText, 50256}}, 50257},
      {"p50k_base", "p50k_base.tiktoken",
       "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069", kR50kPattern,
       {{kEndOfText, 50256}}, 50281},
      {"p50k_edit", "p50k_base.tiktoken",
       "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069", kR50kPattern,
       {{kEndOfText, 50256}, {kFimPrefix, 50281}, {kFimMiddle, 50282}, {kFimSuffix, 50283}},
       50284},
      {"cl100k_base", "cl100k_base.tiktoken",
       "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7", kCl100kPattern,
       {{kEndOfText, 100257},
        {kFimPrefix, 100258},
        {kFimMiddle, 100259},
        {kFimSuffix, 100260},
        {kEndOfPrompt, 100276}},
       100277},
      {"o200k_base", "o200k_base.tiktoken",
       "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", kO200kPattern,
       {{kEndOfText, 199999}, {kEndOfPrompt, 200018}}, 200019},
  };
  return all;
}

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1)
    throw Error("OpenSSL failed to compute a sha256");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

// Standard base64 (RFC 4648) with optional '=' padding; false on any other character.
bool decode_base64(std::string_view text, std::string& out) {
  out.clear();
  uint32_t accumulator = 0;
  int bits = 0;
  size_t padding = 0;
  for (char c : text) {
    int value;
    if (c >= 'A' && c <= 'Z') value = c - 'A';
    else if (c >= 'a' && c <= 'z') value = c - 'a' + 26;
    else if (c >= '0' && c <= '9') value = c - '0' + 52;
    else if (c == '+') value = 62;
    else if (c == '/') value = 63;
    else if (c == '=') { ++padding; continue; }
    else return false;
    if (padding > 0) return false;  // data after padding
    accumulator = (accumulator << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((accumulator >> bits) & 0xff);
    }
  }
  return padding <= 2 && !out.empty();
}

struct Candidate {  // a pair of adjacent parts [start, middle) [middle, end) that could merge
  int32_t rank;
  uint32_t start;
  uint32_t end;
  auto operator<=>(const Candidate&) const = default;  // lowest rank, then leftmost, first
};

}  // namespace

// tiktoken runs its patterns on Rust's regex, where \s is the Unicode White_Space property;
// PCRE2's \s (with UCP) also takes U+180E, which left White_Space in Unicode 6.3. Spelling
// White_Space out keeps the pieces identical.
std::string spell_out_white_space(std::string_view pattern) {
  constexpr std::string_view ws =
      R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(ws) : "[" + std::string(ws) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(ws) + "]";
      } else {
        LOOM_CHECK(next != 'S', "BPE split pattern: \\S inside a character class is not supported");
        out += c;
        out += next;
      }
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out += c;
  }
  return out;
}

const BpeEncoding* find_bpe_encoding(std::string_view name) {
  if (name == "gpt2") name = "r50k_base";
  for (const BpeEncoding& e : encodings())
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<std::string> bpe_encoding_names() {
  std::vector<std::string> names = {"gpt2"};
  for (const BpeEncoding& e : encodings()) names.emplace_back(e.name);
  return names;
}

struct BpeTokenizer::Splitter {
  pcre2_code* code = nullptr;
  ~Splitter() { pcre2_code_free(code); }
};

BpeTokenizer::BpeTokenizer(const BpeEncoding& encoding, const std::string& data_dir)
    : encoding_(encoding), splitter_(std::make_unique<Splitter>()) {
  for (const SpecialToken& s : encoding_.specials)
    if (s.text == kEndOfText) eot_ = s.id;
  LOOM_CHECK(eot_ >= 0, "BPE encoding " + std::string(encoding_.name) + " defines no " + std::string(kEndOfText));
  load_ranks((std::filesystem::path(data_dir) / "gpt-tokenizer" / encoding_.rank_file).string());

  std::string pattern = spell_out_white_space(encoding_.pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: arbitrary bytes are matched as far as they are valid UTF-8 (see encode).
  splitter_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                                  &error, &error_offset, nullptr);
  if (splitter_->code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error, message.data(), message.size());
    throw Error("BPE encoding " + std::string(encoding_.name) + ": PCRE2 rejects the split pattern at offset " +
                std::to_string(error_offset) + ": " + reinterpret_cast<const char*>(message.data()));
  }
  // Where this PCRE2 has no JIT, pcre2_match interprets the pattern: same pieces, slower.
  pcre2_jit_compile(splitter_->code, PCRE2_JIT_COMPLETE);
}

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::load_ranks(const std::string& path) {
  const std::string who = "tokenizer " + std::string(encoding_.name) + ": rank file " + path;
  LOOM_CHECK(std::filesystem::is_regular_file(path),
        who + " not found; run scripts/setup.sh to fetch the verified tokenizer data");
  std::string text = read_file(path);
  std::string actual = sha256_hex(text);
  LOOM_CHECK(actual == encoding_.sha256, who + " has sha256 " + actual + ", expected " +
                                        std::string(encoding_.sha256) +
                                        "; run scripts/setup.sh to fetch it again");

  const auto vocab = static_cast<size_t>(encoding_.vocab_size);
  token_bytes_.assign(vocab, std::string());
  id_used_.assign(vocab, false);
  for (const SpecialToken& s : encoding_.specials) {
    token_bytes_[static_cast<size_t>(s.id)] = std::string(s.text);
    id_used_[static_cast<size_t>(s.id)] = true;
  }
  ranks_.reserve(vocab);
  std::string bytes;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.empty()) continue;
    auto fail = [&](const std::string& what) {
      throw Error(who + " line " + std::to_string(line_no) + ": " + what);
    };
    size_t space = line.find(' ');
    if (space == std::string_view::npos) fail("expected '<base64 bytes> <rank>'");
    int32_t rank = -1;
    auto [end, ec] = std::from_chars(line.data() + space + 1, line.data() + line.size(), rank);
    if (ec != std::errc() || end != line.data() + line.size() || rank < 0 || rank >= encoding_.vocab_size)
      fail("rank must be an integer in 0.." + std::to_string(encoding_.vocab_size - 1));
    if (!decode_base64(line.substr(0, space), bytes)) fail("token bytes are not base64");
    if (id_used_[static_cast<size_t>(rank)]) fail("rank " + std::to_string(rank) + " is used twice");
    if (!ranks_.emplace(bytes, rank).second) fail("the same token bytes appear twice");
    token_bytes_[static_cast<size_t>(rank)] = bytes;
    id_used_[static_cast<size_t>(rank)] = true;
  }
  // Byte-level BPE can encode any input only if every single byte is a token.
  for (int b = 0; b < 256; ++b)
    LOOM_CHECK(rank_of(std::string(1, static_cast<char>(b))) != INT32_MAX,
          who + " has no token for byte " + std::to_string(b) + "; it is not a byte-level BPE rank file");
}

int32_t BpeTokenizer::rank_of(std::string_view bytes) const {
  auto it = ranks_.find(bytes);
  return it == ranks_.end() ? INT32_MAX : it->second;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out, MergeMemo& memo) const {
  // A piece that is itself a token is taken whole, as tiktoken does, before any merging.
  if (auto it = ranks_.find(piece); it != ranks_.end()) {
    out.push_back(it->second);
    return;
  }
  // Words recur within a document; merging each distinct one once halves the encode time.
  // Long pieces are rare and would only grow the memo.
  constexpr size_t kMaxMemoPiece = 64;
  if (piece.size() <= kMaxMemoPiece) {
    if (auto it = memo.find(piece); it != memo.end()) {
      for (uint32_t k = 0; k < it->second.second; ++k) out.push_back(out[it->second.first + k]);
      return;
    }
  }
  const size_t first = out.size();
  // Parts form a linked list; part i covers [i, end[i]) and starts alive as byte i. A heap of
  // candidate pairs keeps the merge O(n log n), so a long piece (a run of digits or letters
  // with no space) costs no more than its length warrants.
  const auto n = static_cast<uint32_t>(piece.size());
  std::vector<uint32_t> end(n), next(n), prev(n);
  std::vector<bool> alive(n, true);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](uint32_t start, uint32_t stop) {
    int32_t rank = rank_of(piece.substr(start, stop - start));
    if (rank != INT32_MAX) heap.push({rank, start, stop});
  };
  for (uint32_t i = 0; i < n; ++i) {
    end[i] = i + 1;
    next[i] = i + 1;  // n: none
    prev[i] = i - 1;  // wraps to UINT32_MAX for the first part: none
  }
  for (uint32_t i = 0; i + 1 < n; ++i) push(i, i + 2);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // A candidate is stale once either of its parts has merged since: the right neighbour's
    // end only ever grows, so comparing it with the recorded end detects that.
    if (!alive[c.start] || next[c.start] == n || end[next[c.start]] != c.end) continue;
    uint32_t right = next[c.start];
    alive[right] = false;
    end[c.start] = end[right];
    next[c.start] = next[right];
    if (next[c.start] != n) prev[next[c.start]] = c.start;
    if (prev[c.start] != UINT32_MAX) push(prev[c.start], end[c.start]);
    if (next[c.start] != n) push(c.start, end[next[c.start]]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out.push_back(rank_of(piece.substr(i, end[i] - i)));
  if (piece.size() <= kMaxMemoPiece && out.size() <= UINT32_MAX)
    memo.emplace(piece, std::pair{static_cast<uint32_t>(first), static_cast<uint32_t>(out.size() - first)});
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // The patterns repeat no groups, so PCRE2's default JIT stack suffices for any input length.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(pcre2_match_data_create(1, nullptr),
                                                                            &pcre2_match_data_free);
  LOOM_CHECK(match != nullptr, "BPE encode: out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  MergeMemo memo;
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = pcre2_match(splitter_->code, subject, text.size(), offset, 0, match.get(), nullptr);
    size_t begin = text.size();
    size_t stop = text.size();
    if (rc >= 0) {
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      begin = ovector[0];
      stop = ovector[1];
      if (stop <= begin)
        throw Error("BPE encode: split pattern of " + std::string(encoding_.name) +
                    " matched an empty piece at byte " + std::to_string(begin));
    } else if (rc != PCRE2_ERROR_NOMATCH) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      throw Error("BPE encode (" + std::string(encoding_.name) + ") failed at byte " + std::to_string(offset) +
                  ": " + reinterpret_cast<const char*>(message.data()));
    }
    // Every valid character starts a match, so skipped bytes are invalid UTF-8: they become a
    // piece of their own, which keeps decode(encode(bytes)) == bytes for any input.
    if (begin > offset) encode_piece(text.substr(offset, begin - offset), ids, memo);
    if (stop > begin) encode_piece(text.substr(begin, stop - begin), ids, memo);
    offset = stop;
  }
  return ids;
}

std::optional<int32_t> BpeTokenizer::special_token_id(std::string_view text) const {
  for (const SpecialToken& s : encoding_.specials)
    if (s.text == text) return s.id;
  return std::nullopt;
}

std::optional<std::string_view> BpeTokenizer::rank_bytes(int32_t id) const {
  if (id < 0 || id >= encoding_.vocab_size || !id_used_[static_cast<size_t>(id)]) return std::nullopt;
  for (const SpecialToken& s : encoding_.specials)
    if (s.id == id) return std::nullopt;
  return token_bytes_[static_cast<size_t>(id)];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= encoding_.vocab_size || !id_used_[static_cast<size_t>(id)])
      throw Error("tokenizer " + std::string(encoding_.name) + ": cannot decode id " + std::to_string(id) +
                  " at position " + std::to_string(i) + "; valid ids are the ranks and special tokens in 0.." +
                  std::to_string(encoding_.vocab_size - 1));
    out += token_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace loom::data
