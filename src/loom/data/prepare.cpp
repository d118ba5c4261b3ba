#include "loom/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/indexed_dataset.h"
#include "loom/data/line_reader.h"

namespace loom::data {

namespace fs = std::filesystem;

namespace {

// Text gathered before a parallel encode: bounds memory while keeping every thread busy.
constexpr size_t kChunkBytes = size_t{64} << 20;

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; });
}

}  // namespace

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = bytes[i];
    if (c == 0) return i;  // text files hold no NUL bytes
    size_t extra = 0;
    uint32_t lowest = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, lowest = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, lowest = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, lowest = 0x10000;
    } else {
      return i;
    }
    if (n - i <= extra) return i;
    uint32_t code = c & (0x3F >> extra);
    for (size_t k = 1; k <= extra; ++k) {
      if ((bytes[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (bytes[i + k] & 0x3F);
    }
    if (code < lowest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += extra + 1;
  }
  return std::nullopt;
}

bool is_json_lines(const std::string& path) {
  fs::path name(path);
  if (name.extension() == ".zst" || name.extension() == ".gz") name = name.stem();
  return name.extension() == ".jsonl" || name.extension() == ".json";
}

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status))
      throw Error("input '" + input + "' does not exist (expected a text or JSONL file, or a directory of them)");
    if (fs::is_directory(status)) {
      std::vector<std::string> found;
      try {
        for (const fs::directory_entry& entry : fs::recursive_directory_iterator(input)) {
          const std::string path = entry.path().string();
          if (entry.is_regular_file() && (entry.path().extension() == ".txt" || is_json_lines(path))) {
            found.push_back(path);
          }
        }
      } catch (const fs::filesystem_error& e) {
        throw Error("cannot list input directory '" + input + "': " + e.code().message());
      }
      if (found.empty()) {
        throw Error("input directory '" + input + "' holds no *.txt files nor JSON lines (*.jsonl, *.json, "
                    "either also .zst or .gz)");
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(status)) {
      files.push_back(input);
    } else {
      throw Error("input '" + input + "' is neither a regular file nor a directory");
    }
  }
  return files;
}

std::vector<std::string_view> split_documents(std::string_view text, size_t min_bytes) {
  std::vector<std::string_view> documents;
  constexpr size_t kNone = std::string_view::npos;
  size_t doc_start = kNone;  // start of the document being built
  size_t para_end = 0;       // end of the last paragraph line seen (without its newline)
  bool in_paragraph = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == kNone) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    if (!is_blank(line)) {
      if (doc_start == kNone) doc_start = pos;
      para_end = (eol > pos && text[eol - 1] == '\r') ? eol - 1 : eol;
      in_paragraph = true;
    } else if (in_paragraph) {
      in_paragraph = false;
      if (para_end - doc_start >= min_bytes) {
        documents.push_back(text.substr(doc_start, para_end - doc_start));
        doc_start = kNone;
      }
    }
    pos = eol + 1;
  }
  if (doc_start != kNone) documents.push_back(text.substr(doc_start, para_end - doc_start));
  return documents;
}

bool is_validation_document(uint64_t seed, int64_t document_index, double val_fraction) {
  PhiloxBlock r = philox4x32(philox_key(seed, "data.split"), static_cast<uint64_t>(document_index));
  uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) | (r[1] >> 11);  // 53 bits
  double u = static_cast<double>(bits) * 0x1p-53;
  return u < val_fraction;
}

namespace {

// Each document's tokens followed by `eot`, encoded in parallel, in the documents' order.
std::vector<std::vector<int32_t>> encode_documents(const Tokenizer& tokenizer,
                                                   const std::vector<std::string_view>& documents, int32_t eot) {
  std::vector<std::vector<int32_t>> encoded(documents.size());
  std::exception_ptr failure;
  const int64_t count = static_cast<int64_t>(documents.size());
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < count; ++i) {
    try {
      std::vector<int32_t>& tokens = encoded[static_cast<size_t>(i)];
      tokens = tokenizer.encode(documents[static_cast<size_t>(i)]);
      tokens.push_back(eot);
    } catch (...) {
#pragma omp critical(loom_prepare_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return encoded;
}

// Each document of a JSON-lines file, in order: the string `key` of each line's object.
void read_json_lines(const std::string& path, const std::string& key, PrepareStats& stats,
                     const std::function<void(std::string)>& document) {
  LineReader lines(path);
  std::string line;
  const int64_t bytes_before = stats.bytes;
  while (lines.next(line)) {
    if (is_blank(line)) continue;
    const std::string where = "'" + path + "' line " + std::to_string(lines.line_number());
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(where + " is not JSON: " + e.what());
    }
    if (!record.is_object()) throw Error(where + " is not a JSON object (a JSONL corpus holds one object per line)");
    const auto value = record.find(key);
    if (value == record.end()) {
      std::string keys;
      for (const auto& item : record.items()) keys += (keys.empty() ? "" : ", ") + item.key();
      throw Error(where + " has no key '" + key + "' (its keys: " + (keys.empty() ? "none" : keys) +
                  "); name the text's key with --json-key");
    }
    if (!value->is_string()) {
      throw Error(where + ": '" + key + "' is " + std::string(value->type_name()) + ", not a string");
    }
    std::string text = value->get<std::string>();
    if (text.empty()) {
      ++stats.empty_records;
      continue;
    }
    document(std::move(text));
  }
  stats.bytes = bytes_before + lines.bytes();
}

// Documents gathered a chunk at a time, encoded in parallel and written in input order (so the
// files do not depend on the thread count) to the train or validation dataset by their index.
class SplitWriter {
 public:
  SplitWriter(const Tokenizer& tokenizer, const std::string& output_prefix, double val_fraction, uint64_t seed,
              PrepareStats& stats)
      : tokenizer_(tokenizer),
        train_(output_prefix + "_train", dtype_for_vocab(tokenizer.vocab_size())),
        val_(output_prefix + "_val", dtype_for_vocab(tokenizer.vocab_size())),
        val_fraction_(val_fraction),
        seed_(seed),
        stats_(stats) {}

  // Keeps `text` alive until its documents are written (a deque never moves its elements).
  std::string_view keep(std::string text) { return texts_.emplace_back(std::move(text)); }
  void add(std::string_view document) { documents_.push_back(document); }
  // `bytes` more text gathered: encodes what is pending once it makes a chunk.
  void account(size_t bytes) {
    pending_bytes_ += bytes;
    if (pending_bytes_ >= kChunkBytes) flush();
  }
  void flush() {
    for (const std::vector<int32_t>& tokens : encode_documents(tokenizer_, documents_, tokenizer_.eot_token())) {
      const int64_t n = static_cast<int64_t>(tokens.size());
      if (is_validation_document(seed_, next_document_++, val_fraction_)) {
        val_.add_document(tokens);
        stats_.val_documents += 1;
        stats_.val_tokens += n;
      } else {
        train_.add_document(tokens);
        stats_.train_documents += 1;
        stats_.train_tokens += n;
      }
    }
    texts_.clear();
    documents_.clear();
    pending_bytes_ = 0;
  }
  int64_t documents() const { return next_document_; }
  void finish() {
    train_.finish();
    val_.finish();
  }

 private:
  const Tokenizer& tokenizer_;
  IndexedDatasetWriter train_, val_;
  double val_fraction_;
  uint64_t seed_;
  PrepareStats& stats_;
  int64_t next_document_ = 0;
  std::deque<std::string> texts_;
  std::vector<std::string_view> documents_;
  size_t pending_bytes_ = 0;
};

// Empty splits are legal but rarely meant: say which one and why.
void warn_about_empty_splits(PrepareStats& stats, const std::string& output_prefix, double val_fraction) {
  std::ostringstream fraction;
  fraction << val_fraction;
  if (stats.train_documents == 0)
    stats.warnings.push_back("the train split '" + output_prefix + "_train' is empty: all " +
                             std::to_string(stats.val_documents) + " documents went to validation (val fraction " +
                             fraction.str() + "); it cannot be trained on. Lower the val fraction or add text");
  if (stats.val_documents == 0 && val_fraction > 0.0)
    stats.warnings.push_back("the validation split '" + output_prefix + "_val' is empty: none of the " +
                             std::to_string(stats.train_documents) + " documents was drawn for it (val fraction " +
                             fraction.str() + "); raise the val fraction or add text to evaluate on");
}

}  // namespace

PrepareStats prepare_dataset(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                             const std::string& output_prefix, double val_fraction, uint64_t seed,
                             const std::string& json_key) {
  if (!(val_fraction >= 0.0 && val_fraction <= 1.0))
    throw Error("validation fraction " + std::to_string(val_fraction) + " must be in [0, 1]");
  if (inputs.empty()) throw Error("no inputs given (expected text or JSONL files, or directories of them)");
  if (output_prefix.empty() || fs::path(output_prefix).filename().empty())
    throw Error("output prefix '" + output_prefix + "' must name files (e.g. data/corpus), not a directory");
  const std::vector<std::string> files = list_input_files(inputs);

  fs::path parent = fs::path(output_prefix).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw Error("cannot create output directory '" + parent.string() + "': " + ec.message());
  }

  PrepareStats stats;
  stats.files = static_cast<int64_t>(files.size());
  SplitWriter out(tokenizer, output_prefix, val_fraction, seed, stats);
  for (const std::string& file : files) {
    if (is_json_lines(file)) {
      read_json_lines(file, json_key, stats, [&](std::string text) {
        const std::string_view document = out.keep(std::move(text));
        out.add(document);
        out.account(document.size());
      });
      continue;
    }
    const std::string_view text = out.keep(read_file(file));
    if (const std::optional<size_t> bad = first_invalid_utf8(text)) {
      stats.warnings.push_back("input '" + file + "' is not UTF-8 text (byte " + std::to_string(*bad) +
                               " is not valid UTF-8" + (text[*bad] == '\0' ? ": a NUL byte" : "") +
                               "); is it a binary file? It was tokenized anyway");
    }
    stats.bytes += static_cast<int64_t>(text.size());
    for (const std::string_view document : split_documents(text)) out.add(document);
    out.account(text.size());
  }
  out.flush();

  if (out.documents() == 0) {
    std::string names;
    for (const std::string& input : inputs) names += (names.empty() ? "'" : ", '") + input + "'";
    throw Error("inputs " + names + " hold no text (every file is empty or blank)");
  }
  warn_about_empty_splits(stats, output_prefix, val_fraction);
  if (stats.empty_records > 0) {
    stats.warnings.push_back(std::to_string(stats.empty_records) + " JSON line(s) had an empty '" + json_key +
                             "' and were left out");
  }
  out.finish();
  return stats;
}

}  // namespace loom::data
