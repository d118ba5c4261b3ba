#include "loom/comm/mpi/util.h"

#include "loom/core/error.h"

namespace loom::comm::mpi_detail {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(length));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16:
    case DType::U16: return MPI_UINT16_T;
    case DType::F8E4M3:
    case DType::F8E5M2: return MPI_UINT8_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
  }
  throw Error("mpi backend: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace loom::comm::mpi_detail
