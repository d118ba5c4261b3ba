#include "loom/comm/communicator.h"

#include "loom/core/error.h"

namespace loom::comm {

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  throw Error("reduce_op_name: unknown reduce op " + std::to_string(static_cast<int>(op)) + " (valid: sum, avg, max)");
}

}  // namespace loom::comm
