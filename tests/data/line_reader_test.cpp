// data/line_reader.h: the same lines from a plain file, a zstd file of several frames and a gzip
// file of several members (written by the libraries' own compressors); lines across block
// boundaries; truncated, corrupt and misnamed streams are errors naming the file.
#include "loom/data/line_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/core/error.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

class LineReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("loom_lines_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  // `parts` as zstd frames one after another.
  void write_zstd(const std::string& name, const std::vector<std::string>& parts) const {
    std::string bytes;
    for (const std::string& part : parts) {
      std::string frame(ZSTD_compressBound(part.size()), '\0');
      const size_t n = ZSTD_compress(frame.data(), frame.size(), part.data(), part.size(), 3);
      ASSERT_FALSE(ZSTD_isError(n));
      bytes += frame.substr(0, n);
    }
    write(name, bytes);
  }
  // `parts` as gzip members one after another.
  void write_gzip(const std::string& name, const std::vector<std::string>& parts) const {
    for (size_t i = 0; i < parts.size(); ++i) {
      gzFile file = gzopen(path(name).c_str(), i == 0 ? "wb" : "ab");
      ASSERT_NE(file, nullptr);
      const int written = gzwrite(file, parts[i].data(), static_cast<unsigned>(parts[i].size()));
      ASSERT_EQ(written, static_cast<int>(parts[i].size()));
      gzclose(file);
    }
  }

  std::vector<std::string> lines_of(const std::string& name, int64_t* bytes = nullptr) const {
    LineReader reader(path(name));
    std::vector<std::string> lines;
    std::string line;
    while (reader.next(line)) {
      lines.push_back(line);
      EXPECT_EQ(reader.line_number(), static_cast<int64_t>(lines.size()));
    }
    if (bytes != nullptr) *bytes = reader.bytes();
    return lines;
  }

  fs::path dir_;
};

// Lines of every kind: CRLF, empty, one of 3 MiB (across the 1 MiB blocks), a last one without
// a newline.
std::string awkward_text() {
  std::string text = "first\r\n\nthird line\n";
  text += std::string(3 * 1024 * 1024 + 17, 'x') + "\n";
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + "\n";
  return text + "no newline at the end";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

TEST_F(LineReaderTest, PlainZstdAndGzipGiveTheSameLines) {
  const std::string text = awkward_text();
  const std::vector<std::string> want = split_lines(text);
  ASSERT_EQ(want[0], "first");
  ASSERT_EQ(want[1], "");
  write("a.jsonl", text);
  const std::vector<std::string> parts = {text.substr(0, 1000), text.substr(1000, 2 * 1024 * 1024),
                                          text.substr(1000 + 2 * 1024 * 1024)};
  write_zstd("a.jsonl.zst", parts);
  write_gzip("a.jsonl.gz", parts);
  for (const char* name : {"a.jsonl", "a.jsonl.zst", "a.jsonl.gz"}) {
    int64_t bytes = 0;
    EXPECT_EQ(lines_of(name, &bytes), want) << name;
    EXPECT_EQ(bytes, static_cast<int64_t>(text.size())) << name;
  }
  write("empty.jsonl", "");
  EXPECT_TRUE(lines_of("empty.jsonl").empty());
  write_zstd("empty.jsonl.zst", {""});
  EXPECT_TRUE(lines_of("empty.jsonl.zst").empty());
}

TEST_F(LineReaderTest, BadStreamsAreNamedErrors) {
  const std::string text = awkward_text();
  write_zstd("whole.zst", {text});
  const std::string zstd_bytes = [&] {
    std::ifstream in(path("whole.zst"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  write("cut.zst", zstd_bytes.substr(0, zstd_bytes.size() / 2));
  write("garbage.zst", "this is not zstd at all\n");
  write_gzip("whole.gz", {text});
  const std::string gzip_bytes = [&] {
    std::ifstream in(path("whole.gz"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  write("cut.gz", gzip_bytes.substr(0, gzip_bytes.size() / 2));
  write("plain.gz", "plain text under a .gz name\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cut.zst", "truncated"}, {"garbage.zst", "not a valid zstd stream"},
      {"cut.gz", "truncated"},  {"plain.gz", "not gzip data"},
      {"missing.jsonl", "cannot open"},
  };
  for (const auto& [name, why] : cases) {
    try {
      lines_of(name);
      ADD_FAILURE() << name << ": expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path(name)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace loom::data
