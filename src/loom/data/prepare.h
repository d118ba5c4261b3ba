#pragma once
// Dataset preparation (`loom data prepare`): text files or JSONL corpora -> documents -> tokens ->
// a training and a validation indexed dataset, deterministically for a given seed.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

struct PrepareStats {
  int64_t files = 0;
  int64_t bytes = 0;  // text read (after decompression)
  int64_t empty_records = 0;  // JSON lines whose text is empty (skipped)
  int64_t train_documents = 0;
  int64_t train_tokens = 0;  // including one eot per document
  int64_t val_documents = 0;
  int64_t val_tokens = 0;
  // Things the output is made of but a user probably did not mean: an input that is not UTF-8
  // text (a binary file), an empty train or validation split. One sentence each.
  std::vector<std::string> warnings;
};

// Documents are at least this much text (except a file's last one), so that each is a
// meaningful unit for the train/validation split rather than a stray line.
inline constexpr size_t kMinDocumentBytes = 4096;

// JSON lines (Megatron's preprocess_data.py input: one JSON object per line, one document each):
// a name ending in .jsonl or .json, optionally followed by .zst or .gz (data/line_reader.h).
bool is_json_lines(const std::string& path);

// Inputs are files or directories; a directory contributes all `*.txt` files and JSON-lines files
// (is_json_lines) below it, sorted by path. Throws loom::Error naming an input that is missing
// or holds no such files.
std::vector<std::string> list_input_files(const std::vector<std::string>& inputs);

// Splits text at paragraph boundaries (lines holding only whitespace) and merges consecutive
// paragraphs until a document has at least `min_bytes`. Each document runs from the start of its
// first paragraph to the end of its last (the blank lines between them kept); blank text around
// documents is dropped. The views point into `text`.
std::vector<std::string_view> split_documents(std::string_view text, size_t min_bytes = kMinDocumentBytes);

// Whether the document with this global index (0-based, in input order) goes to validation:
// a 53-bit uniform from philox4x32(philox_key(seed, "data.split"), index) is < val_fraction.
bool is_validation_document(uint64_t seed, int64_t document_index, double val_fraction);

// Writes `<output_prefix>_train.{bin,idx}` and `<output_prefix>_val.{bin,idx}` (creating the
// parent directory); each document is encoded and followed by tokenizer.eot_token(). A text file's
// documents are its paragraphs merged (split_documents); a JSON-lines file's are the string
// `json_key` of each line's object, in order (blank lines and empty strings skipped; a line that
// is not such an object is an Error naming the file and line). Encodes
// documents in parallel with OpenMP, so tokenizer.encode() must be safe to call concurrently;
// the output does not depend on the thread count. Prints nothing. Throws loom::Error for a bad
// val_fraction (valid: [0, 1]), a missing input, or inputs with no text.
// The offset of the first byte that breaks UTF-8 (or is NUL), or nothing for valid text.
std::optional<size_t> first_invalid_utf8(std::string_view text);

PrepareStats prepare_dataset(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                             const std::string& output_prefix, double val_fraction, uint64_t seed,
                             const std::string& json_key = "text");

}  // namespace loom::data
