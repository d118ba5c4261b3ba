#include "loom/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <filesystem>
#include <optional>
#include <sstream>
#include <system_error>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/indexed_dataset.h"

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

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status))
      throw Error("input '" + input + "' does not exist (expected a text file or a directory of *.txt files)");
    if (fs::is_directory(status)) {
      std::vector<std::string> found;
      try {
        for (const fs::directory_entry& entry : fs::recursive_directory_iterator(input)) {
          if (entry.is_regular_file() && entry.path().extension() == ".txt") found.push_back(entry.path().string());
        }
      } catch (const fs::filesystem_error& e) {
        throw Error("cannot list input directory '" + input + "': " + e.code().message());
      }
      if (found.empty()) throw Error("input directory '" + input + "' holds no *.txt files");
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
                             const std::string& output_prefix, double val_fraction, uint64_t seed) {
  if (!(val_fraction >= 0.0 && val_fraction <= 1.0))
    throw Error("validation fraction " + std::to_string(val_fraction) + " must be in [0, 1]");
  if (inputs.empty()) throw Error("no inputs given (expected text files or directories of *.txt files)");
  if (output_prefix.empty() || fs::path(output_prefix).filename().empty())
    throw Error("output prefix '" + output_prefix + "' must name files (e.g. data/corpus), not a directory");
  const std::vector<std::string> files = list_input_files(inputs);

  fs::path parent = fs::path(output_prefix).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw Error("cannot create output directory '" + parent.string() + "': " + ec.message());
  }

  const TokenDType dtype = dtype_for_vocab(tokenizer.vocab_size());
  const int32_t eot = tokenizer.eot_token();
  IndexedDatasetWriter train(output_prefix + "_train", dtype);
  IndexedDatasetWriter val(output_prefix + "_val", dtype);
  PrepareStats stats;
  stats.files = static_cast<int64_t>(files.size());
  int64_t next_document = 0;

  // Texts stay alive (a deque never moves its elements) while their documents are encoded.
  std::deque<std::string> texts;
  std::vector<std::string_view> documents;
  size_t pending_bytes = 0;

  auto encode_pending = [&]() {
    // Written in input order, so the files do not depend on the thread count.
    for (const std::vector<int32_t>& tokens : encode_documents(tokenizer, documents, eot)) {
      const int64_t n = static_cast<int64_t>(tokens.size());
      if (is_validation_document(seed, next_document++, val_fraction)) {
        val.add_document(tokens);
        stats.val_documents += 1;
        stats.val_tokens += n;
      } else {
        train.add_document(tokens);
        stats.train_documents += 1;
        stats.train_tokens += n;
      }
    }
    texts.clear();
    documents.clear();
    pending_bytes = 0;
  };

  for (const std::string& file : files) {
    texts.push_back(read_file(file));
    const std::string& text = texts.back();
    if (const std::optional<size_t> bad = first_invalid_utf8(text)) {
      stats.warnings.push_back("input '" + file + "' is not UTF-8 text (byte " + std::to_string(*bad) +
                               " is not valid UTF-8" + (text[*bad] == '\0' ? ": a NUL byte" : "") +
                               "); is it a binary file? It was tokenized anyway");
    }
    stats.bytes += static_cast<int64_t>(text.size());
    std::vector<std::string_view> found = split_documents(text);
    documents.insert(documents.end(), found.begin(), found.end());
    pending_bytes += text.size();
    if (pending_bytes >= kChunkBytes) encode_pending();
  }
  encode_pending();

  if (next_document == 0) {
    std::string names;
    for (const std::string& input : inputs) names += (names.empty() ? "'" : ", '") + input + "'";
    throw Error("inputs " + names + " hold no text (every file is empty or blank)");
  }
  warn_about_empty_splits(stats, output_prefix, val_fraction);
  train.finish();
  val.finish();
  return stats;
}

}  // namespace loom::data
