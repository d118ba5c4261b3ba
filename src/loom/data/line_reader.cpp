#include "loom/data/line_reader.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "loom/core/error.h"

namespace loom::data {

namespace {

constexpr size_t kBlockBytes = size_t{1} << 20;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

class LineReader::Source {
 public:
  virtual ~Source() = default;
  // Up to `capacity` bytes into `out`; 0 at the end. Throws loom::Error on a bad stream.
  virtual size_t read(char* out, size_t capacity) = 0;
};

namespace {

class PlainSource : public LineReader::Source {
 public:
  explicit PlainSource(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "rb")) {
    if (file_ == nullptr) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  }
  ~PlainSource() override { std::fclose(file_); }
  size_t read(char* out, size_t capacity) override {
    const size_t n = std::fread(out, 1, capacity, file_);
    if (n == 0 && std::ferror(file_)) throw Error("cannot read '" + path_ + "': " + std::strerror(errno));
    return n;
  }

 protected:
  std::string path_;
  std::FILE* file_;
};

// zstd frames one after another, decompressed as a stream.
class ZstdSource : public PlainSource {
 public:
  explicit ZstdSource(const std::string& path) : PlainSource(path), stream_(ZSTD_createDStream()), input_(kBlockBytes) {
    if (stream_ == nullptr) throw Error("cannot start a zstd decoder for '" + path + "'");
  }
  ~ZstdSource() override { ZSTD_freeDStream(stream_); }
  size_t read(char* out, size_t capacity) override {
    ZSTD_outBuffer output{out, capacity, 0};
    while (output.pos == 0) {
      // A call that filled its output may have left decoded bytes in the decoder: those come
      // first, before more input is read (or the end of the file is taken for a truncation).
      if (in_.pos == in_.size && !output_was_full_) {
        const size_t n = PlainSource::read(input_.data(), input_.size());
        if (n == 0) {
          if (frame_open_) throw Error("'" + path_ + "' ends inside a zstd frame: the file is truncated");
          return 0;
        }
        in_ = ZSTD_inBuffer{input_.data(), n, 0};
      }
      const size_t left = ZSTD_decompressStream(stream_, &output, &in_);
      if (ZSTD_isError(left)) {
        throw Error("'" + path_ + "' is not a valid zstd stream: " + ZSTD_getErrorName(left));
      }
      frame_open_ = left != 0;
      output_was_full_ = output.pos == output.size;
    }
    return output.pos;
  }

 private:
  ZSTD_DStream* stream_;
  std::vector<char> input_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_open_ = false, output_was_full_ = false;
};

// gzip members one after another (zlib's gzread reads them all).
class GzipSource : public LineReader::Source {
 public:
  explicit GzipSource(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) throw Error("cannot open '" + path + "': " + std::strerror(errno));
    gzbuffer(file_, static_cast<unsigned>(kBlockBytes));
  }
  ~GzipSource() override { gzclose(file_); }
  size_t read(char* out, size_t capacity) override {
    const int n = gzread(file_, out, static_cast<unsigned>(capacity));
    // zlib passes bytes without a gzip header through as they are; a .gz name promises gzip.
    if (gzdirect(file_)) throw Error("'" + path_ + "' is not gzip data (its name ends in .gz)");
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (n < 0 || (code != Z_OK && code != Z_STREAM_END)) {
      throw Error("'" + path_ + "' is not a valid gzip stream" +
                  (code == Z_BUF_ERROR ? std::string(": the file is truncated") : ": " + std::string(message)));
    }
    return static_cast<size_t>(n);
  }

 private:
  std::string path_;
  gzFile file_;
};

}  // namespace

LineReader::LineReader(const std::string& path) : path_(path) {
  if (ends_with(path, ".zst")) source_ = std::make_unique<ZstdSource>(path);
  else if (ends_with(path, ".gz")) source_ = std::make_unique<GzipSource>(path);
  else source_ = std::make_unique<PlainSource>(path);
}

LineReader::~LineReader() = default;

bool LineReader::fill() {
  if (ended_) return false;
  if (start_ > 0) {  // drop the lines already returned
    buffer_.erase(0, start_);
    start_ = 0;
  }
  const size_t old = buffer_.size();
  buffer_.resize(old + kBlockBytes);
  const size_t n = source_->read(buffer_.data() + old, kBlockBytes);
  buffer_.resize(old + n);
  bytes_ += static_cast<int64_t>(n);
  ended_ = n == 0;
  return n > 0;
}

bool LineReader::next(std::string& line) {
  size_t searched = start_;
  for (;;) {
    const size_t newline = buffer_.find('\n', searched);
    if (newline != std::string::npos) {
      size_t end = newline;
      if (end > start_ && buffer_[end - 1] == '\r') --end;
      line.assign(buffer_, start_, end - start_);
      start_ = newline + 1;
      ++line_number_;
      return true;
    }
    searched = buffer_.size() - start_;  // offset from the start, which fill() moves to 0
    if (!fill()) break;
  }
  if (start_ >= buffer_.size()) return false;
  line.assign(buffer_, start_, std::string::npos);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  start_ = buffer_.size();
  ++line_number_;
  return true;
}

}  // namespace loom::data
