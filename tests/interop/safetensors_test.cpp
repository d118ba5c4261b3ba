// The safetensors reader and writer: a hand-built file parsed exactly, the writer's layout, and
// every strictness rule refused with a message naming the file, the tensor and the problem.
#include "loom/interop/hf/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../ckpt/ckpt_test_util.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::interop::hf {
namespace {

// A file image: the 8-byte little-endian length of `header`, `header`, then `data`.
std::string file_of(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

std::string f32_bytes(std::vector<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Parsing `file` throws a loom::Error whose message holds every one of `mentions`.
void expect_rejected(const std::string& file, std::initializer_list<std::string> mentions) {
  try {
    parse_safetensors(file, "weights.safetensors");
    ADD_FAILURE() << "accepted a bad file; expected an error mentioning " << *mentions.begin();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("weights.safetensors", 0), 0u) << "message does not start with the file: " << message;
    for (const std::string& m : mentions) EXPECT_NE(message.find(m), std::string::npos) << "missing '" << m << "' in: " << message;
  }
}

const std::string kTwoTensors =
    R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(Safetensors, ParsesAHandBuiltFileExactly) {
  const std::string data = f32_bytes({1.5f, -2.0f}) + std::string("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  const std::string file = file_of(kTwoTensors, data);
  const SafetensorsHeader h = parse_safetensors(file, "weights.safetensors");
  EXPECT_EQ(h.data_offset, 8 + kTwoTensors.size());
  EXPECT_EQ(h.data_bytes, 12u);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by name
  EXPECT_EQ(h.tensors[0].dtype, "F32");
  EXPECT_EQ(h.tensors[0].shape, (std::vector<uint64_t>{2}));
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[0].end, 8u);
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].dtype, "BF16");
  EXPECT_EQ(h.tensors[1].shape, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(h.tensors[1].numel(), 2u);
  EXPECT_EQ(h.tensors[1].bytes(), 4u);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_NE(h.find("b"), nullptr);
  EXPECT_EQ(h.find("c"), nullptr);

  // The same through the file reader, with the data.
  ckpt::test::TempDir dir;
  write_file_atomic(dir / "w.safetensors", file);
  SafetensorsReader reader(dir / "w.safetensors");
  std::vector<std::byte> a(8), b(4);
  reader.read(reader.tensor("a"), a);
  reader.read(reader.tensor("b"), b);
  float values[2];
  std::memcpy(values, a.data(), 8);
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(std::memcmp(b.data(), "\x80\x3f\x00\x40", 4), 0);
  EXPECT_THROW(reader.tensor("c"), Error);
}

TEST(Safetensors, AcceptsScalarsEmptyTensorsPaddingAndAnEmptyFile) {
  const std::string header =
      R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[8,8]}})";
  const SafetensorsHeader h = parse_safetensors(file_of(header + "      ", std::string(8, '\1')), "x");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.find("s")->numel(), 1u);
  EXPECT_EQ(h.find("e")->numel(), 0u);
  EXPECT_TRUE(parse_safetensors(file_of("{}", ""), "x").tensors.empty());
}

TEST(Safetensors, WriterPadsTheHeaderAndRoundTrips) {
  ckpt::test::TempDir dir;
  const std::string path = dir / "out.safetensors";
  const std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<SafetensorsOutput> tensors = {
      {"model.a", "F32", {2, 3}, [&](std::span<std::byte> out) { std::memcpy(out.data(), a.data(), out.size()); }},
      {"model.b", "BF16", {3}, [](std::span<std::byte> out) { std::memset(out.data(), 0x3f, out.size()); }},
  };
  write_safetensors(path, tensors, {{"format", "pt"}});
  const std::string file = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(file.size(), 8 + n + 24 + 6);
  // Insertion order: metadata first, then the tensors in data order; padded with spaces.
  EXPECT_EQ(file.substr(8, n),
            R"({"__metadata__":{"format":"pt"},"model.a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
            R"("model.b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]}})" +
                std::string(n - 156, ' '));
  const SafetensorsHeader h = parse_safetensors(file, path);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.data_offset % 8, 0u);
  EXPECT_EQ(std::memcmp(file.data() + h.data_offset, a.data(), 24), 0);
  EXPECT_EQ(file.substr(h.data_offset + 24), std::string(6, '\x3f'));
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(Safetensors, WriterRefusesBadTensorsAndLeavesTheOldFileOnFailure) {
  ckpt::test::TempDir dir;
  const std::string path = dir / "out.safetensors";
  auto zeros = [](std::span<std::byte> out) { std::memset(out.data(), 0, out.size()); };
  write_safetensors(path, {{"a", "F32", {1}, zeros}}, {});
  const std::string before = read_file(path);
  EXPECT_THROW(write_safetensors(path, {{"a", "F32", {1}, zeros}, {"a", "F32", {1}, zeros}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"a", "F33", {1}, zeros}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"", "F32", {1}, zeros}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", "F32", {1}, zeros}}, {}), Error);
  // A failure while writing the data: the previous file stays, no temporary file is left.
  auto failing = [](std::span<std::byte>) { throw Error("source tensor unreadable"); };
  EXPECT_THROW(write_safetensors(path, {{"a", "F32", {1}, zeros}, {"b", "F32", {4}, failing}}, {}), Error);
  EXPECT_EQ(read_file(path), before);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.str())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Safetensors, RefusesBadHeaderLengths) {
  expect_rejected("abc", {"file is 3 bytes", "8-byte header length"});
  expect_rejected(file_of("", ""), {"header length is 0"});
  std::string huge(8, '\0');
  huge[4] = 1;  // 2^32 bytes
  expect_rejected(huge + "{}", {"header length is 4294967296", "over the limit of 100000000"});
  std::string longer = file_of("{}", "");
  longer[0] = 40;  // claims 40 header bytes; 2 follow
  expect_rejected(longer, {"header length is 40", "only 2 bytes follow", "truncated"});
}

TEST(Safetensors, RefusesHeadersThatAreNotTheFormatsJson) {
  expect_rejected(file_of(" {}", ""), {"does not start with '{'"});
  expect_rejected(file_of("{\"a\":", ""), {"not valid JSON"});
  expect_rejected(file_of("{} x", ""), {"not valid JSON"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[[[1]]],"data_offsets":[0,4]}})", ""), {"nests JSON deeper"});
  expect_rejected(file_of(R"({"a":[1]})", ""), {"tensor 'a'", "expected an object"});
  expect_rejected(file_of(R"({"__metadata__":{"k":1}})", ""), {"__metadata__", "'k'", "expected a string"});
  expect_rejected(file_of(R"({"__metadata__":[]})", ""), {"__metadata__", "expected an object"});
}

TEST(Safetensors, RefusesBadEntries) {
  const std::string four(4, '\0');
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1]}})", four), {"tensor 'a'", "has no 'data_offsets'"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", four),
                  {"tensor 'a'", "unknown key 'x'"});
  expect_rejected(file_of(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", four),
                  {"tensor 'a'", "unknown dtype 'F33'", "valid: BOOL"});
  expect_rejected(file_of(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", four), {"dtype is a non-negative integer"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four),
                  {"tensor 'a'", "shape[0] is a negative integer"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", four), {"shape[0] is a non-integer"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":{},"data_offsets":[0,4]}})", four), {"shape is a JSON object"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", four), {"two non-negative integers"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", four), {"end before they begin"});
  expect_rejected(file_of(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", four),
                  {"tensor 'a'", "overflows 64 bits"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551616]}})", four),
                  {"data_offsets[1] is a non-integer"});
  // Control bytes in a name are escaped in the message.
  expect_rejected(file_of("{\"a\\u001b[2J\":{\"dtype\":\"F9\",\"shape\":[1],\"data_offsets\":[0,4]}}", four),
                  {"tensor 'a\\x1b[2J'"});
}

TEST(Safetensors, RefusesWrongSizesTruncationOverlapsGapsAndDuplicates) {
  const std::string twelve(12, '\0');
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor 'a'", "hold 8 bytes", "F32", "3 elements needs 12"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", std::string(8, '\0')),
                  {"tensor 'a'", "reach past the data section's 8 bytes", "truncated"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", twelve),
                  {"tensor 'b'", "overlap tensor 'a'"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", twelve),
                  {"tensor 'b'", "gap of 4 unused bytes"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0')),
                  {"tensor 'a'", "gap of 4"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(8, '\0')),
                  {"4 bytes after the last tensor"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0')),
                  {"repeats the key 'a'", "each tensor name may appear once"});
  expect_rejected(file_of(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
                  {"repeats the key 'dtype'"});
  expect_rejected(file_of(R"({"__metadata__":{},"__metadata__":{}})", ""), {"repeats the key '__metadata__'"});
}

TEST(Safetensors, ReaderNamesTheFileAndRefusesNonFiles) {
  ckpt::test::TempDir dir;
  try {
    SafetensorsReader reader(dir / "missing.safetensors");
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsReader reader(dir.str()), Error);
  // A file cut short after its header was written.
  const std::string file = file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  write_file_atomic(dir / "cut.safetensors", file.substr(0, file.size() - 3));
  try {
    SafetensorsReader reader(dir / "cut.safetensors");
    ADD_FAILURE() << "opened a truncated file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.safetensors: tensor 'a'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::interop::hf
