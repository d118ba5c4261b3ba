#include "loom/ckpt/digest.h"

#include <xxhash.h>

#include <cstddef>
#include <map>
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

// The digest's stream: a header, then per tensor (in name order) its name, dtype, shape and bytes.
class DigestStream {
 public:
  DigestStream() : state_(XXH3_createState(), &XXH3_freeState) {
    LOOM_CHECK(state_ != nullptr, "out of memory computing the parameter digest");
    XXH3_128bits_reset(state_.get());
    put_string(state_.get(), "loom-parameter-digest-v1");
  }
  void add(const std::string& name, DType dtype, const Shape& shape, const std::vector<std::byte>& bytes) {
    put_string(state_.get(), name);
    put_string(state_.get(), dtype_name(dtype));
    put_u64(state_.get(), shape.size());
    for (int64_t d : shape) put_u64(state_.get(), static_cast<uint64_t>(d));
    XXH3_128bits_update(state_.get(), bytes.data(), bytes.size());
  }
  std::string hex() const {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state_.get()));
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned char byte : canonical.digest) {
      out += digits[byte >> 4];
      out += digits[byte & 15];
    }
    return out;
  }

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

}  // namespace

std::string parameter_digest(const LoadedCheckpoint& checkpoint) {
  DigestStream stream;
  std::vector<std::byte> buffer;
  for (const std::string& name : checkpoint.parameter_names()) {  // sorted by name
    const TensorRecord& t = checkpoint.record(name);
    buffer.resize(static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype));
    checkpoint.read(name, buffer.data(), t.dtype, t.shape);
    stream.add(name, t.dtype, t.shape, buffer);
  }
  return stream.hex();
}

std::string parameter_digest(const std::vector<TensorRef>& refs) {
  std::map<std::string, std::vector<const TensorRef*>> by_name;  // sorted by name
  for (const TensorRef& ref : refs)
    if (is_model_parameter(ref.name)) by_name[ref.name].push_back(&ref);
  DigestStream stream;
  std::vector<std::byte> buffer;
  for (const auto& [name, shards] : by_name) {
    const TensorRef& first = *shards.front();
    const Slice whole = full_slice(first.global_shape);
    const size_t element = dtype_size(first.dtype);
    buffer.assign(static_cast<size_t>(shape_numel(first.global_shape)) * element, std::byte{0});
    int64_t covered = 0;
    for (const TensorRef* shard : shards) {
      LOOM_CHECK(shard->global_shape == first.global_shape && shard->dtype == first.dtype,
                 "parameter digest: the shards of " + name + " disagree on its shape or dtype");
      const Slice slice = shard->slice.empty() ? whole : shard->slice;
      check_slice(slice, first.global_shape, name);
      for (const TensorRef* other : shards) {
        LOOM_CHECK(other == shard || !slices_overlap(slice, other->slice.empty() ? whole : other->slice),
                   "parameter digest: two shards of " + name + " overlap");
      }
      copy_region(shard->data, slice, buffer.data(), whole, slice, element);
      covered += slice_numel(slice);
    }
    LOOM_CHECK(covered == shape_numel(first.global_shape),
               "parameter digest: the shards of " + name + " cover " + std::to_string(covered) + " of its " +
                   std::to_string(shape_numel(first.global_shape)) + " elements");
    stream.add(name, first.dtype, first.global_shape, buffer);
  }
  return stream.hex();
}

std::string parameter_digest(const std::string& path_or_root) {
  return parameter_digest(load_checkpoint(path_or_root));
}

}  // namespace loom::ckpt
