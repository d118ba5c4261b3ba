#pragma once
// What rank 0 of a served model tells its follower ranks (tensor parallelism with ranks as MPI
// processes, docs/serving.md): one message per model operation, in the order rank 0 runs them,
// so that every rank runs the same layers and collectives. Encoded explicitly into bytes (a
// version word, the kind, then each field with its length), so a message is the same on every
// machine and a truncated or foreign one is an Error rather than garbage.
#include <cstdint>
#include <string>

#include <vector>

#include "loom/ckpt/slice.h"
#include "loom/model/paged.h"

namespace loom::infer {

enum class StepKind : int32_t {
  Forward = 1,        // one batched forward over `batch` (tokens, positions, block tables, state slots)
  CopyBlock = 2,      // KV block `from` -> `to` (a forked sample's own copy of a partial block)
  CopyStateSlot = 3,  // Mamba state slot `from` -> `to`
  LoadWeights = 4,    // every rank loads its slice of checkpoint `path`
  Digest = 5,         // every rank contributes its shards to the parameter digest
  KeepAlive = 6,      // nothing to run: rank 0 is idle (and checks that the followers still answer)
  Stop = 7,           // the server has stopped: the followers return
  Draft = 8,          // one multi-token prediction depth's drafting rows (`draft`, speculative decoding)
};
std::string step_kind_name(StepKind kind);

struct StepMessage {
  StepKind kind = StepKind::KeepAlive;
  model::PagedBatch batch;  // Forward
  model::DraftBatch draft;  // Draft
  int32_t from = 0, to = 0;  // CopyBlock, CopyStateSlot
  std::string path;          // LoadWeights
};

std::string encode_step(const StepMessage& message);
// An Error naming what is wrong when `bytes` is not a message encode_step wrote.
StepMessage decode_step(const std::string& bytes);

// A follower's answer to Digest: the values of one of its parameter shards (`parameter`: the
// index in the model's parameter list, the same on every rank; `slice`: the region it covers).
struct ShardValues {
  int32_t parameter = 0;
  ckpt::Slice slice;
  std::vector<float> values;
};
std::string encode_shards(const std::vector<ShardValues>& shards);
std::vector<ShardValues> decode_shards(const std::string& bytes);

}  // namespace loom::infer
