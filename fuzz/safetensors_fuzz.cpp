// libFuzzer target: the safetensors parser on arbitrary bytes. Any outcome but a parsed header
// that keeps the format's invariants or a loom::Error is a bug: another exception type, a crash
// or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "loom/interop/hf/safetensors.h"
#include "loom/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  loom::interop::hf::SafetensorsHeader header;
  try {
    header = loom::interop::hf::parse_safetensors(file, "fuzz.safetensors");
  } catch (const loom::Error&) {
    return 0;  // refused with a message: what a bad file should get
  }
  // Accepted: every promise the parser makes must hold.
  if (header.data_offset + header.data_bytes != size || header.data_offset > size) std::abort();
  uint64_t covered = 0;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const loom::interop::hf::SafetensorsTensor& t = header.tensors[i];
    if (i > 0 && !(header.tensors[i - 1].name < t.name)) std::abort();  // sorted, unique
    if (t.begin > t.end || t.end > header.data_bytes) std::abort();
    if (t.bytes() != t.numel() * loom::interop::hf::safetensors_dtype_size(t.dtype)) std::abort();
    if (header.find(t.name) != &t) std::abort();
    covered += t.bytes();
  }
  if (covered != header.data_bytes) std::abort();  // tiled: no gap, no overlap
  return 0;
}
