#include "loom/ckpt/digest.h"

#include <xxhash.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "loom/core/error.h"

namespace loom::ckpt {

namespace {

// Length-prefixed little-endian fields, so that no two different inputs hash the same stream.
void put_u64(XXH3_state_t* state, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  XXH3_128bits_update(state, b, sizeof b);
}

void put_string(XXH3_state_t* state, const std::string& s) {
  put_u64(state, s.size());
  XXH3_128bits_update(state, s.data(), s.size());
}

}  // namespace

std::string parameter_digest(const LoadedCheckpoint& checkpoint) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  LOOM_CHECK(state != nullptr, "out of memory computing the parameter digest");
  XXH3_128bits_reset(state.get());
  put_string(state.get(), "loom-parameter-digest-v1");
  std::vector<std::byte> buffer;
  for (const std::string& name : checkpoint.parameter_names()) {  // sorted by name
    const TensorRecord& t = checkpoint.record(name);
    put_string(state.get(), name);
    put_string(state.get(), dtype_name(t.dtype));
    put_u64(state.get(), t.shape.size());
    for (int64_t d : t.shape) put_u64(state.get(), static_cast<uint64_t>(d));
    buffer.resize(static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype));
    checkpoint.read(name, buffer.data(), t.dtype, t.shape);
    XXH3_128bits_update(state.get(), buffer.data(), buffer.size());
  }
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state.get()));
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char byte : canonical.digest) {
    out += hex[byte >> 4];
    out += hex[byte & 15];
  }
  return out;
}

std::string parameter_digest(const std::string& path_or_root) {
  return parameter_digest(load_checkpoint(path_or_root));
}

}  // namespace loom::ckpt
