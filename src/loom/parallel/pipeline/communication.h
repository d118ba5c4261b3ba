#pragma once
// Every message the pipeline executor exchanges with its neighbouring stages, and the loss it
// shares after evaluation: pipeline_step.cpp calls these and no Communicator method directly.
#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/parallel/pipeline/pipeline_schedule.h"

namespace loom::parallel {

// One message instruction's transfer: `count` floats (activations or their gradient) from
// `send` or into `recv` (one of the two is set).
struct StageMessage {
  const float* send = nullptr;
  float* recv = nullptr;
  int64_t count = 0;
  PipelineMessage message;
};

// Starts the messages of consecutive message instructions as one batch
// (Communicator::exchange_async), as Megatron's send_forward_recv_backward,
// send_backward_recv_forward and (interleaved) send_forward_backward_recv_forward_backward do:
// a stage that sends its forward output while its neighbour sends a gradient back would
// otherwise wait for each other where sends wait for their receive (NCCL). One handle per message; each buffer must stay valid until its handle completes.
std::vector<comm::WorkHandle> start_stage_messages(comm::Communicator& pp, std::span<const StageMessage> messages);
// Evaluation: the loss held by the pipeline rank `root`, on every rank of the pipeline.
double share_loss(comm::Communicator& pp, double loss, int root);

}  // namespace loom::parallel
