#pragma once
// The lines of a file read a block at a time, plain or compressed by its name: `.zst` (zstd, any
// number of frames, as zstd and pzstd write them) or `.gz` (gzip, any number of members). For
// JSONL corpora of many gigabytes (`loom data prepare`), which are seldom shipped uncompressed.
#include <cstdint>
#include <memory>
#include <string>

namespace loom::data {

class LineReader {
 public:
  // Throws loom::Error naming the file when it cannot be opened.
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, without its '\n' (nor a '\r' before it); a last line without '\n' counts.
  // False at the end. Throws loom::Error naming the file for a corrupt or truncated stream.
  bool next(std::string& line);
  int64_t line_number() const { return line_number_; }  // of the line `next` returned, from 1
  int64_t bytes() const { return bytes_; }              // read so far, after decompression

  class Source;  // the file's bytes, decompressed

 private:
  bool fill();  // appends a block to buffer_; false at the end

  std::string path_;
  std::unique_ptr<Source> source_;
  std::string buffer_;
  size_t start_ = 0;  // where the next line starts in buffer_
  bool ended_ = false;
  int64_t line_number_ = 0, bytes_ = 0;
};

}  // namespace loom::data
