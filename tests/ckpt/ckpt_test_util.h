#pragma once
// Helpers shared by the checkpoint tests: a temporary directory and tensors with known bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/atomic_file.h"

namespace loom::ckpt::test {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("loom-ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A host tensor filled with bytes derived from `seed`, and a ref to it.
struct HostTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  std::vector<std::byte> bytes;

  HostTensor(std::string n, Shape s, DType d, unsigned seed) : name(std::move(n)), shape(std::move(s)), dtype(d) {
    bytes.resize(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
    unsigned x = seed * 2654435761u + 12345u;
    for (auto& b : bytes) {
      x = x * 1103515245u + 12345u;
      b = static_cast<std::byte>(x >> 16);
    }
  }
  TensorRef ref() const { return {name, shape, dtype, bytes.data(), {}}; }
};

inline std::vector<TensorRef> refs_of(const std::vector<HostTensor>& tensors) {
  std::vector<TensorRef> out;
  for (const auto& t : tensors) out.push_back(t.ref());
  return out;
}

inline std::vector<std::byte> read_all(const LoadedCheckpoint& c, const std::string& name) {
  std::vector<std::byte> out(static_cast<size_t>(shape_numel(c.shape(name))) * dtype_size(c.dtype(name)));
  c.read(name, out.data(), c.dtype(name), c.shape(name));
  return out;
}

// Flips one byte of a file in place.
inline void flip_byte(const std::string& path, size_t offset) {
  std::string text = read_file(path);
  ASSERT_LT(offset, text.size());
  text[offset] = static_cast<char>(text[offset] ^ 0x5a);
  write_file_atomic(path, text);
}

inline std::string latest_of(const std::string& root) { return read_latest(root).value_or("<none>"); }

}  // namespace loom::ckpt::test
