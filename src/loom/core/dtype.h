#pragma once
// Element types loom stores. Reductions and master weights are always f32.
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

enum class DType : uint8_t { F32, BF16, F16, F8E4M3, F8E5M2, I32, I64, U16 };

size_t dtype_size(DType dtype);
std::string dtype_name(DType dtype);
// Parses "f32", "bf16", "f16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u16"; throws naming the valid ones.
DType parse_dtype(const std::string& name);

}  // namespace loom
