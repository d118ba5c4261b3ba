#include "loom/core/dtype.h"

#include "loom/core/error.h"

namespace loom {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U16: return 2;
  }
  throw Error("dtype_size: unknown dtype");
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F8E4M3: return "fp8_e4m3";
    case DType::F8E5M2: return "fp8_e5m2";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U16: return "u16";
  }
  throw Error("dtype_name: unknown dtype");
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32,
                  DType::I64, DType::U16}) {
    if (dtype_name(d) == name) return d;
  }
  throw Error("unknown dtype '" + name + "' (valid: f32, bf16, f16, fp8_e4m3, fp8_e5m2, i32, i64, u16)");
}

}  // namespace loom
