#pragma once
// The safetensors file format (Hugging Face), read strictly and written crash-safely.
//
//   [8 bytes: N, little-endian u64] [N bytes: UTF-8 JSON header] [data section]
//
// The header is one JSON object: tensor name -> {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [begin, end]}, with offsets relative to the start of the data section, plus an
// optional "__metadata__" object of string -> string. The parser trusts nothing in the file:
// the header length is bounded (<= kMaxSafetensorsHeaderBytes and <= file size - 8), the header
// starts with '{' and is valid JSON with no duplicate keys at any level, every entry has exactly
// the keys dtype/shape/data_offsets with the right types, the dtype is known, the shape's
// element count and byte size do not overflow, end - begin == elements * dtype size, every
// range lies in the data section, and the tensors tile the data section exactly (sorted by
// offset, each begins where the previous one ended, the last ends at the end of the file: no
// overlap, no gap, no trailing bytes). Every failure is a loom::Error naming the file, the
// tensor and what is wrong. The writer pads the header with spaces to a multiple of 8 bytes so
// the data section is 8-byte aligned, and replaces the target file atomically.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::interop::hf {

// The safetensors reference implementation's limit; a larger header is refused unread.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

// Bytes per element of a safetensors dtype name ("F32", "BF16", ...); 0 when the name is not
// one of the format's dtypes.
size_t safetensors_dtype_size(std::string_view dtype);
// The dtype names the format defines, comma-separated (for error messages).
std::string safetensors_dtype_names();

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // the format's name: "F32", "BF16", "F16", ...
  std::vector<uint64_t> shape;   // [] is a scalar (one element)
  uint64_t begin = 0, end = 0;   // byte range in the data section
  uint64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;      // sorted by name
  std::map<std::string, std::string> metadata; // "__metadata__", empty when absent
  uint64_t data_offset = 0;                    // where the data section starts in the file (8 + N)
  uint64_t data_bytes = 0;                     // the data section's size

  // nullptr when absent.
  const SafetensorsTensor* find(std::string_view name) const;
};

// Validates the 8-byte length prefix of a file of `file_size` bytes and returns N; errors name
// `where` (the file).
uint64_t parse_safetensors_header_length(std::string_view first_8_bytes, uint64_t file_size,
                                         const std::string& where);
// Parses and checks the N header bytes of a file of `file_size` bytes (the data section is what
// follows them).
SafetensorsHeader parse_safetensors_header(std::string_view header, uint64_t file_size, const std::string& where);
// Both steps on a whole file held in memory (tests, the fuzz target).
SafetensorsHeader parse_safetensors(std::string_view file, const std::string& where);

// A safetensors file opened for reading: the header is read and checked on open, tensor data
// on demand (so a file larger than memory can be converted one tensor at a time).
class SafetensorsReader {
 public:
  // Throws naming the file when it cannot be opened, is not a regular file, or fails a check.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // Throws naming the file and the tensor when absent.
  const SafetensorsTensor& tensor(std::string_view name) const;
  // Copies the tensor's bytes (little-endian elements, row-major) into `out`, which must hold
  // exactly tensor.bytes(); throws naming the file and tensor if the file was cut short meanwhile.
  void read(const SafetensorsTensor& tensor, std::span<std::byte> out) const;

 private:
  std::string path_;
  int fd_ = -1;
  SafetensorsHeader header_;
};

// One tensor to write: `fill` writes its bytes (little-endian, row-major; exactly
// numel * dtype size of them) into the buffer it is given.
struct SafetensorsOutput {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<uint64_t> shape;
  std::function<void(std::span<std::byte>)> fill;
};

// Writes `path` atomically: tensors in the given order, one at a time (memory: the largest
// tensor), `metadata` as "__metadata__" when not empty. Throws naming the tensor when a name is
// empty, reserved or repeated, or a dtype unknown.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace loom::interop::hf
