#pragma once
// Every message the pipeline executor exchanges with its neighbouring stages, and the loss it
// shares after evaluation: pipeline_step.cpp calls these and no Communicator method directly.
#include <cstdint>

#include "loom/comm/communicator.h"
#include "loom/parallel/pipeline/pipeline_schedule.h"

namespace loom::parallel {

// Receives `count` floats (activations or their gradient) into `buffer`, blocking.
void receive_activations(comm::Communicator& pp, float* buffer, int64_t count, const PipelineMessage& message);
// Starts sending `count` floats; `buffer` must stay valid until the returned work completes.
comm::WorkHandle start_send_activations(comm::Communicator& pp, const float* buffer, int64_t count,
                                        const PipelineMessage& message);
// Evaluation: the loss held by the pipeline rank `root`, on every rank of the pipeline.
double share_loss(comm::Communicator& pp, double loss, int root);

}  // namespace loom::parallel
