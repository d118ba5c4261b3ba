#pragma once
// The refit over the communication layer (grpo.refit = comm, docs/collectives.md): after a
// learner step, the learner's ranks send the model parameters to every generation worker's
// process, in buckets of grpo.refit_bucket_mb. `group` holds the learner's ranks first (group
// ranks 0 .. learners-1, in the learner world's order), then the generation workers'.
//
// 1. Every learner rank describes its shards (as its checkpoint would store them: name, global
//    shape, dtype, slice); rank 0 gathers the descriptions (gather_text), lays every rank's
//    shards out as one byte stream per rank (each shard at an offset) and broadcasts the plan
//    (with the weight version) to the whole group.
// 2. Each learner rank sends its stream to each worker in turn (worker by worker, bucket by
//    bucket: send/recv of i32 words); each worker receives the learner ranks' streams in rank
//    order (the same order on every process, so no send waits on a cycle).
// 3. Each worker places every shard into its full tensor; the shards of a save tile every
//    parameter exactly, checked by counting elements.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"

namespace loom::rl {

// The refit group's settings: a worker waits in it from one step's refit to the next, as long
// as a step may take (grpo.step_timeout_s and two grpo.generation_timeout_s).
comm::CommOptions refit_comm_options(const config::RunConfig& config);

// Learner rank side: collective over `group` with every worker's receive_parameters.
void send_parameters(comm::Communicator& group, int learners, const std::vector<ckpt::TensorRef>& shards,
                     const std::string& version, int64_t bucket_bytes);

// The full parameters a worker received, each tensor whole (row-major).
struct ReceivedParameters {
  std::string version;
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  std::vector<std::vector<std::byte>> data;
  // As refs of whole tensors (pointing into `data`), for a checkpoint or a digest.
  std::vector<ckpt::TensorRef> refs() const;
};

// Worker side: collective over `group` with the learner ranks' send_parameters.
ReceivedParameters receive_parameters(comm::Communicator& group, int learners, int64_t bucket_bytes);

}  // namespace loom::rl
