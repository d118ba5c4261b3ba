#include "loom/infer/communication.h"

#include <cstring>

#include "loom/comm/gather_text.h"

namespace loom::infer {

StepMessage exchange_step(comm::Communicator& world, const StepMessage* message) {
  const bool root = world.rank() == 0;
  const std::string bytes = root ? encode_step(*message) : std::string();
  int64_t size = static_cast<int64_t>(bytes.size());
  world.broadcast(&size, 1, DType::I64, 0);
  // Bytes travel as whole i32 words (the communication layer has no byte type).
  std::vector<int32_t> words(static_cast<size_t>((size + 3) / 4), 0);
  if (root) std::memcpy(words.data(), bytes.data(), bytes.size());
  world.broadcast(words.data(), static_cast<int64_t>(words.size()), DType::I32, 0);
  if (root) return *message;
  return decode_step(std::string(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(size)));
}

std::vector<std::string> gather_shards(const std::string& shards, comm::Communicator& world) {
  return comm::gather_text(shards, world, 0);
}

}  // namespace loom::infer
