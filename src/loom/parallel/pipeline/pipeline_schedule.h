#pragma once
// Pipeline schedules as explicit instruction lists, one list per pipeline rank.
//
// The model's layers are cut into p * v consecutive virtual stages; virtual stage s lives on
// rank s % p as its model chunk s / p (v = 1: rank r holds stage r). A micro-batch flows
// forward through the virtual stages in order and its gradient flows back in reverse. Each
// rank executes its list top to bottom: sends are asynchronous (they never block the list),
// receives wait for their message. What the schedules differ in is the order of forward and
// backward passes on each rank, which decides the bubble and the activation memory:
//   GPipe        all forwards, then all backwards: m micro-batches of activations held.
//   1F1B         p - r - 1 warm-up forwards on rank r, then one forward, one backward, ...:
//                at most p - r micro-batches of activations held (p on the first stage).
//   interleaved  1F1B over v chunks per rank, micro-batches in groups of p per chunk
//                (Megatron-LM's interleaved schedule): the bubble shrinks by v.
// With forward time f and backward time b per stage, GPipe and 1F1B idle (p - 1)(f + b) per
// rank against m (f + b) of work, a bubble fraction of (p - 1) / m; interleaving makes each
// chunk v times cheaper, (p - 1) / (v m).
#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/enums.h"

namespace loom::parallel {

enum class PipelineOp : uint8_t {
  RecvForward,   // the chunk's input activations from the previous virtual stage
  Forward,
  SendForward,   // the chunk's output activations to the next virtual stage
  RecvBackward,  // the gradient of the chunk's output from the next virtual stage
  Backward,
  SendBackward,  // the gradient of the chunk's input to the previous virtual stage
  ReduceGradients,  // the step's last backward is done: finish the data-parallel reduction
};

// A point-to-point message (a send or a recv), and of those a send.
inline bool is_message(PipelineOp op) {
  return op == PipelineOp::RecvForward || op == PipelineOp::SendForward || op == PipelineOp::RecvBackward ||
         op == PipelineOp::SendBackward;
}
inline bool is_send(PipelineOp op) { return op == PipelineOp::SendForward || op == PipelineOp::SendBackward; }
std::string pipeline_op_name(PipelineOp op);

struct PipelineInstruction {
  PipelineOp op;
  int micro_batch = 0;
  int chunk = 0;  // the rank's model chunk (0 .. v-1)
  bool operator==(const PipelineInstruction&) const = default;
};

// parallel.pipeline_schedule's enum (config/enums.h), parsed when the config is read.
using PipelineScheduleKind = config::PipelineScheduleKind;
// "gpipe" | "1f1b" | "interleaved" (the config's table of names); anything else is an Error
// listing them.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);
std::string pipeline_schedule_name(PipelineScheduleKind kind);

struct PipelineSchedule {
  PipelineScheduleKind kind = PipelineScheduleKind::OneFOneB;
  int stages = 1;          // p: pipeline ranks
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v: model chunks per rank
  std::vector<std::vector<PipelineInstruction>> ranks;  // [p] instruction lists

  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  int rank_of(int virtual_stage) const { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
  int total_stages() const { return stages * virtual_stages; }
  bool first_stage(int rank, int chunk) const { return virtual_stage(rank, chunk) == 0; }
  bool last_stage(int rank, int chunk) const { return virtual_stage(rank, chunk) == total_stages() - 1; }
};

// Builds the schedule; a shape it cannot run is an Error naming the sizes and what would be
// valid (p, m >= 1; v > 1 only for interleaved, which needs p > 1 and m a multiple of p).
PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int stages, int micro_batches,
                                        int virtual_stages = 1);

// The other end of a message instruction (a send or receive) of `rank`, and its tag: unique per
// pair of ranks and direction (from the micro-batch and the sender's chunk), so messages match
// whatever their order.
struct PipelineMessage {
  int peer = 0;
  int tag = 0;
};
PipelineMessage pipeline_message(const PipelineSchedule& schedule, int rank, const PipelineInstruction& message);

}  // namespace loom::parallel
