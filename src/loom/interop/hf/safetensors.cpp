#include "loom/interop/hf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::interop::hf {

using nlohmann::json;

namespace {

struct DTypeInfo {
  std::string_view name;
  size_t size;
};

// The dtypes of the safetensors format with their element sizes.
constexpr std::array<DTypeInfo, 16> kDTypes = {{
    {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2},
    {"I32", 4}, {"U32", 4}, {"F32", 4},
    {"F64", 8}, {"I64", 8}, {"U64", 8},
}};

// A name from the file as it appears in a message: quoted, control bytes escaped (so a
// hostile name cannot rewrite the terminal), long names cut.
std::string shown_name(std::string_view text) {
  constexpr size_t kShown = 120;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  if (text.size() > kShown) out += " (cut; " + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string tensor_where(const std::string& where, std::string_view name) {
  return where + ": tensor " + shown_name(name);
}

// The JSON type of a value from the file, for messages (never the value itself, which may be huge).
std::string kind(const json& value) {
  if (value.is_number_unsigned()) return "a non-negative integer";
  if (value.is_number_integer()) return "a negative integer";
  if (value.is_number_float()) return "a non-integer number";
  return std::string("a JSON ") + value.type_name();
}

// "[begin, end]" (appended piecewise: GCC 12 warns falsely on "literal" + std::string temporaries).
std::string range_text(uint64_t begin, uint64_t end) {
  std::string out = "[";
  out += std::to_string(begin);
  out += ", ";
  out += std::to_string(end);
  out += "]";
  return out;
}

uint64_t read_u64_le(std::string_view bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return value;
}

// Parses the header JSON, refusing duplicate keys at any level (json would silently keep the
// last) and nesting deeper than the format has (top object > entry > shape array).
json parse_header_json(std::string_view header, const std::string& where) {
  std::vector<std::set<std::string>> keys;  // one per open object or array (arrays stay empty)
  auto callback = [&](int, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        keys.emplace_back();
        LOOM_CHECK(keys.size() <= 3, where + ": header nests JSON deeper than the format allows "
                                        "(object of tensors > tensor entry > shape list)");
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        LOOM_CHECK(!keys.empty() && keys.back().insert(key).second,
              where + ": header repeats the key " + shown_name(key) +
                  (keys.size() == 1 ? " (each tensor name may appear once)" : " in one object"));
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(header.begin(), header.end(), callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw Error(where + ": header is not valid JSON: " + e.what());
  }
}

uint64_t unsigned_member(const json& value, const std::string& what) {
  LOOM_CHECK(value.is_number_unsigned(), what + " is " + kind(value) + "; expected a non-negative integer");
  return value.get<uint64_t>();
}

SafetensorsTensor parse_entry(const std::string& name, const json& entry, uint64_t data_bytes,
                              const std::string& where) {
  const std::string at = tensor_where(where, name);
  LOOM_CHECK(entry.is_object(), at + " is " + kind(entry) + "; expected an object with dtype, shape and data_offsets");
  for (const auto& [key, value] : entry.items()) {
    LOOM_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
          at + " has the unknown key " + shown_name(key) + " (valid: dtype, shape, data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    LOOM_CHECK(entry.contains(key), at + " has no '" + key + "'");
  }
  SafetensorsTensor t;
  t.name = name;

  const json& dtype = entry.at("dtype");
  LOOM_CHECK(dtype.is_string(), at + ": dtype is " + kind(dtype) + "; expected a string");
  t.dtype = dtype.get<std::string>();
  const size_t element = safetensors_dtype_size(t.dtype);
  LOOM_CHECK(element != 0, at + ": unknown dtype " + shown_name(t.dtype) + " (valid: " + safetensors_dtype_names() + ")");

  const json& shape = entry.at("shape");
  LOOM_CHECK(shape.is_array(), at + ": shape is " + kind(shape) + "; expected a list of non-negative integers");
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t dim = unsigned_member(shape[i], at + ": shape[" + std::to_string(i) + "]");
    t.shape.push_back(dim);
    LOOM_CHECK(!__builtin_mul_overflow(numel, dim, &numel), at + ": shape's element count overflows 64 bits");
  }
  uint64_t expected_bytes = 0;
  LOOM_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(element), &expected_bytes),
        at + ": shape's byte size overflows 64 bits");

  const json& offsets = entry.at("data_offsets");
  LOOM_CHECK(offsets.is_array() && offsets.size() == 2,
        at + ": data_offsets must be a list of two non-negative integers [begin, end]");
  t.begin = unsigned_member(offsets[0], at + ": data_offsets[0]");
  t.end = unsigned_member(offsets[1], at + ": data_offsets[1]");
  const std::string range = at + ": data_offsets " + range_text(t.begin, t.end);
  LOOM_CHECK(t.begin <= t.end, range + " end before they begin");
  LOOM_CHECK(t.end <= data_bytes, range + " reach past the data section's " + std::to_string(data_bytes) +
                                 " bytes (file truncated?)");
  LOOM_CHECK(t.end - t.begin == expected_bytes,
        range + " hold " + std::to_string(t.end - t.begin) + " bytes but dtype " + t.dtype + " with shape of " +
            std::to_string(numel) + " elements needs " + std::to_string(expected_bytes));
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& metadata, const std::string& where) {
  const std::string at = where + ": " + std::string(kSafetensorsMetadataKey);
  LOOM_CHECK(metadata.is_object(), at + " is " + kind(metadata) + "; expected an object of string values");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    LOOM_CHECK(value.is_string(), at + " key " + shown_name(key) + " is " + kind(value) + "; expected a string");
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The spec's layout rule: sorted by offset, the tensors cover the data section exactly.
void check_tiling(const std::vector<SafetensorsTensor>& tensors, uint64_t data_bytes, const std::string& where) {
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t cursor = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor* t : by_offset) {
    const std::string range = range_text(t->begin, t->end);
    if (t->begin < cursor) {
      throw Error(tensor_where(where, t->name) + ": data_offsets " + range + " overlap tensor " +
                  shown_name(previous->name) + " (which ends at " + std::to_string(cursor) + ")");
    }
    if (t->begin > cursor) {
      throw Error(tensor_where(where, t->name) + ": data_offsets " + range + " leave a gap of " +
                  std::to_string(t->begin - cursor) + " unused bytes before it (at " + std::to_string(cursor) +
                  "); tensors must tile the data section");
    }
    cursor = t->end;
    previous = t;
  }
  LOOM_CHECK(cursor == data_bytes, where + ": the data section has " + std::to_string(data_bytes - cursor) +
                                  " bytes after the last tensor (at " + std::to_string(cursor) + " of " +
                                  std::to_string(data_bytes) + "); tensors must tile the data section");
}

std::string errno_text() { return std::strerror(errno); }

// pread until `bytes` are read; false on a short file.
bool read_exact(int fd, void* out, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

size_t safetensors_dtype_size(std::string_view dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == dtype) return info.size;
  }
  return 0;
}

std::string safetensors_dtype_names() {
  std::string out;
  for (const DTypeInfo& info : kDTypes) out += (out.empty() ? "" : ", ") + std::string(info.name);
  return out;
}

uint64_t SafetensorsTensor::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // checked not to overflow when parsed
  return n;
}

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

uint64_t parse_safetensors_header_length(std::string_view first_8_bytes, uint64_t file_size, const std::string& where) {
  LOOM_CHECK(file_size >= 8 && first_8_bytes.size() >= 8,
        where + ": file is " + std::to_string(file_size) +
            " bytes; a safetensors file starts with an 8-byte header length (truncated or not safetensors?)");
  const uint64_t length = read_u64_le(first_8_bytes);
  LOOM_CHECK(length >= 2, where + ": header length is " + std::to_string(length) +
                         " bytes; the smallest header, {}, has 2 (not a safetensors file?)");
  LOOM_CHECK(length <= kMaxSafetensorsHeaderBytes,
        where + ": header length is " + std::to_string(length) + " bytes, over the limit of " +
            std::to_string(kMaxSafetensorsHeaderBytes) + " (corrupt, or not a safetensors file?)");
  LOOM_CHECK(length <= file_size - 8, where + ": header length is " + std::to_string(length) + " bytes but only " +
                                     std::to_string(file_size - 8) +
                                     " bytes follow the length field (file truncated?)");
  return length;
}

SafetensorsHeader parse_safetensors_header(std::string_view header, uint64_t file_size, const std::string& where) {
  LOOM_CHECK(file_size >= 8 + header.size(), where + ": header of " + std::to_string(header.size()) +
                                            " bytes does not fit a file of " + std::to_string(file_size) + " bytes");
  LOOM_CHECK(!header.empty() && header.front() == '{',
        where + ": header does not start with '{' (the format requires a JSON object with no leading bytes)");
  const json root = parse_header_json(header, where);
  LOOM_CHECK(root.is_object(), where + ": header is " + kind(root) + "; expected a JSON object");

  SafetensorsHeader out;
  out.data_offset = 8 + header.size();
  out.data_bytes = file_size - out.data_offset;
  for (const auto& [name, entry] : root.items()) {
    if (name == kSafetensorsMetadataKey) {
      out.metadata = parse_metadata(entry, where);
    } else {
      out.tensors.push_back(parse_entry(name, entry, out.data_bytes, where));
    }
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
  check_tiling(out.tensors, out.data_bytes, where);
  return out;
}

SafetensorsHeader parse_safetensors(std::string_view file, const std::string& where) {
  const uint64_t length = parse_safetensors_header_length(file.substr(0, 8), file.size(), where);
  return parse_safetensors_header(file.substr(8, length), file.size(), where);
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error("cannot open safetensors file '" + path_ + "': " + errno_text());
  try {
    struct stat st {};
    LOOM_CHECK(::fstat(fd_, &st) == 0, "cannot stat '" + path_ + "': " + errno_text());
    LOOM_CHECK(S_ISREG(st.st_mode), path_ + ": not a regular file");
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    std::string prefix(8, '\0');
    const bool have_prefix = size >= 8 && read_exact(fd_, prefix.data(), 8, 0);
    const uint64_t length = parse_safetensors_header_length(have_prefix ? prefix : std::string_view(), size, path_);
    std::string header(length, '\0');
    LOOM_CHECK(read_exact(fd_, header.data(), header.size(), 8), path_ + ": cannot read the " + std::to_string(length) +
                                                                " header bytes (file truncated while reading?)");
    header_ = parse_safetensors_header(header, size, path_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensor& SafetensorsReader::tensor(std::string_view name) const {
  const SafetensorsTensor* t = header_.find(name);
  LOOM_CHECK(t != nullptr, path_ + ": has no tensor " + shown_name(name));
  return *t;
}

void SafetensorsReader::read(const SafetensorsTensor& tensor, std::span<std::byte> out) const {
  LOOM_CHECK(out.size() == tensor.bytes(), tensor_where(path_, tensor.name) + ": read into " + std::to_string(out.size()) +
                                          " bytes, but it holds " + std::to_string(tensor.bytes()));
  LOOM_CHECK(read_exact(fd_, out.data(), out.size(), header_.data_offset + tensor.begin),
        tensor_where(path_, tensor.name) + ": cannot read its " + std::to_string(tensor.bytes()) +
            " bytes (file truncated or changed while reading?)");
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Insertion order, so the metadata comes first and the entries follow the data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[std::string(kSafetensorsMetadataKey)] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsOutput& t : tensors) {
    const std::string at = tensor_where(path, t.name);
    LOOM_CHECK(!t.name.empty(), path + ": cannot write a tensor with an empty name");
    LOOM_CHECK(t.name != kSafetensorsMetadataKey, at + ": the name is reserved for the metadata");
    LOOM_CHECK(names.insert(t.name).second, at + " is given twice");
    const size_t element = safetensors_dtype_size(t.dtype);
    LOOM_CHECK(element != 0, at + ": unknown dtype " + shown_name(t.dtype) + " (valid: " + safetensors_dtype_names() + ")");
    uint64_t bytes = element;
    for (uint64_t d : t.shape) LOOM_CHECK(!__builtin_mul_overflow(bytes, d, &bytes), at + ": byte size overflows 64 bits");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces (the format allows trailing whitespace) so the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFileWriter out(path);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(length, sizeof length);
  out.write(text.data(), text.size());
  std::vector<std::byte> buffer;
  for (const SafetensorsOutput& t : tensors) {
    uint64_t bytes = safetensors_dtype_size(t.dtype);
    for (uint64_t d : t.shape) bytes *= d;
    buffer.assign(bytes, std::byte{0});
    t.fill(buffer);
    out.write(buffer.data(), buffer.size());
  }
  out.commit();
}

}  // namespace loom::interop::hf
