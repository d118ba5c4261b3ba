#include "loom/parallel/pipeline/pipeline_step.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/parallel/pipeline/communication.h"

namespace loom::parallel {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// A trace range's suffix: which of this rank's model chunks (virtual stages) runs.
std::string chunk_name(int chunk) { return "chunk " + std::to_string(chunk); }
}  // namespace

std::vector<model::LayerRange> stage_chunks(const parallel::PipelineSchedule& schedule, int rank,
                                            const std::vector<int>& bounds) {
  std::vector<model::LayerRange> chunks;
  for (int c = 0; c < schedule.virtual_stages; ++c) {
    const int stage = schedule.virtual_stage(rank, c);
    chunks.push_back({bounds.at(stage), bounds.at(stage + 1)});
  }
  return chunks;
}

PipelineSyncOptions pipeline_sync_options(const model::Transformer& model, const parallel::PipelineSchedule& schedule,
                                          comm::Communicator* embedding) {
  PipelineSyncOptions options;
  // The last stage's copy of the embedding (a tied head, multi-token prediction's lookups) and
  // the first stage's embedding have their gradients summed.
  const bool copied = model.config().tied_embeddings || model.config().mtp_depths > 0;
  if (model.embedding_copy() >= 0) {
    options.tied_param = model.embedding_copy();
  } else if (model.holds_embedding() && copied && schedule.stages > 1) {
    options.tied_param = model.params().find("model.embed_tokens.weight");
  }
  if (options.tied_param >= 0) options.tied_group = embedding;
  options.reduce_once_per_step = schedule.virtual_stages > 1;
  return options;
}

PipelineStep::PipelineStep(comm::Communicator& pp, model::Transformer& model, parallel::PipelineSchedule schedule,
                           GradientSync& dp, comm::Communicator* embedding)
    : pp_(pp), model_(model), dp_(dp), schedule_(std::move(schedule)), rank_(pp.rank()) {
  LOOM_CHECK(schedule_.stages == pp.size(), "pipeline schedule for " + std::to_string(schedule_.stages) +
                                           " stages on a pipeline group of " + std::to_string(pp.size()) + " ranks");
  LOOM_CHECK(static_cast<int>(model.chunks().size()) == schedule_.virtual_stages,
        "pipeline rank " + std::to_string(rank_) + " holds " + std::to_string(model.chunks().size()) +
            " model chunks but the schedule runs " + std::to_string(schedule_.virtual_stages) + " per rank");
  const PipelineSyncOptions expected = pipeline_sync_options(model, schedule_, embedding);
  const PipelineSyncOptions& given = dp.pipeline_options();
  LOOM_CHECK(given.tied_param == expected.tied_param && given.tied_group == expected.tied_group &&
                 given.reduce_once_per_step == expected.reduce_once_per_step,
             "pipeline rank " + std::to_string(rank_) +
                 ": the gradient synchronisation was not built for this stage; pass "
                 "pipeline_sync_options(model, schedule, embedding) when making it");
}

void PipelineStep::set_schedule(parallel::PipelineSchedule schedule) {
  LOOM_CHECK(schedule.kind == schedule_.kind && schedule.stages == schedule_.stages &&
                 schedule.virtual_stages == schedule_.virtual_stages,
             "pipeline rank " + std::to_string(rank_) + ": a new schedule must keep the kind, the " +
                 std::to_string(schedule_.stages) + " stages and the " + std::to_string(schedule_.virtual_stages) +
                 " virtual stages per rank; only its micro-batches change");
  LOOM_CHECK(live_.empty(), "pipeline rank " + std::to_string(rank_) + ": schedule changed inside a step");
  schedule_ = std::move(schedule);
}

PipelineStep::~PipelineStep() {
  try {
    recycle(true);
  } catch (...) {
    // Unwinding from a failed step: the original error is what matters.
  }
}

PipelineStep::InFlight& PipelineStep::acquire(Key key) {
  auto [it, fresh] = live_.try_emplace(key);
  if (fresh) {
    recycle(false);
    if (pool_.empty()) {
      it->second.activations = std::make_unique<model::Activations>();
    } else {
      it->second.activations = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  return it->second;
}

void PipelineStep::release(Key key) {
  auto it = live_.find(key);
  LOOM_CHECK(it != live_.end(), "pipeline: no activations in flight for micro-batch " + std::to_string(key.first) +
                               " chunk " + std::to_string(key.second));
  retiring_.push_back(std::move(it->second));
  live_.erase(it);
}

// Returns released activations whose sends have completed to the pool (all of them if `wait`).
void PipelineStep::recycle(bool wait) {
  for (size_t i = 0; i < retiring_.size();) {
    bool done = true;
    for (comm::WorkHandle& send : retiring_[i].sends) {
      if (wait) {
        send->wait();
      } else if (!send->test()) {
        done = false;
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    pool_.push_back(std::move(retiring_[i].activations));
    retiring_.erase(retiring_.begin() + static_cast<long>(i));
  }
}

namespace {
// Whether the batch of message instructions starting at `next` sends micro-batch chunk `key`'s
// input gradient back.
bool batch_sends_back(const std::vector<parallel::PipelineInstruction>& list, size_t next, std::pair<int, int> key) {
  for (size_t j = next; j < list.size() && is_message(list[j].op); ++j) {
    if (list[j].op == parallel::PipelineOp::SendBackward && list[j].micro_batch == key.first && list[j].chunk == key.second) {
      return true;
    }
  }
  return false;
}
}  // namespace

// The message instructions [begin, end) of the rank's list, started as one batch: the sends
// (whose activations stay held until theirs complete) and the receives. Returns the receives'
// handles, for the caller to wait on before the data is used (not on the sends: where sends are
// buffered, threads and mpi, a stage runs on while its messages wait for their receiver).
comm::WorkHandle PipelineStep::start_messages(size_t begin, size_t end, int64_t rows, int64_t count) {
  const std::vector<parallel::PipelineInstruction>& list = schedule_.ranks[rank_];
  std::vector<StageMessage> messages;
  for (size_t j = begin; j < end; ++j) {
    const parallel::PipelineInstruction& in = list[j];
    InFlight& f = acquire({in.micro_batch, in.chunk});
    StageMessage m{.count = count, .message = parallel::pipeline_message(schedule_, rank_, in)};
    switch (in.op) {
      case parallel::PipelineOp::RecvForward: m.recv = model_.chunk_input(*f.activations, in.chunk, rows); break;
      case parallel::PipelineOp::SendForward: m.send = model_.chunk_output(*f.activations, in.chunk); break;
      case parallel::PipelineOp::RecvBackward: m.recv = model_.chunk_output_grad(*f.activations, rows); break;
      default: m.send = model_.chunk_input_grad(*f.activations); break;  // SendBackward
    }
    messages.push_back(m);
  }
  std::vector<comm::WorkHandle> work = start_stage_messages(pp_, messages), receives;
  for (size_t j = begin; j < end; ++j) {
    const parallel::PipelineInstruction& in = list[j];
    if (!is_send(in.op)) {
      receives.push_back(work[j - begin]);
      continue;
    }
    acquire({in.micro_batch, in.chunk}).sends.push_back(work[j - begin]);
    if (in.op == parallel::PipelineOp::SendBackward) release({in.micro_batch, in.chunk});
  }
  return receives.empty() ? nullptr : comm::all_of(std::move(receives));
}

void PipelineStep::wait_for(const comm::WorkHandle& work) {
  trace::Range range("pipeline receive wait");
  const Clock::time_point start = Clock::now();
  work->wait();
  stats_.wait_seconds += seconds_since(start);
}

double PipelineStep::forward(Key key, const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                             float grad_scale, const model::Packing& packing) {
  InFlight& f = acquire(key);
  trace::Range range("forward micro-batch", key.first, chunk_name(key.second).c_str());
  const Clock::time_point start = Clock::now();
  const double loss_sum = model_.forward_chunk(*f.activations, key.second, inputs, targets, batch, seq, grad_scale, packing);
  stats_.compute_seconds += seconds_since(start);
  int64_t bytes = 0;
  for (const auto& [k, held] : live_) bytes += held.activations->bytes();
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, static_cast<int>(live_.size()));
  stats_.peak_activation_bytes = std::max(stats_.peak_activation_bytes, bytes);
  return loss_sum;
}

double PipelineStep::run(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                         float grad_scale, const model::Packing& packing) {
  GradientSync& dp = dp_;
  const parallel::PipelineSchedule& s = schedule_;
  const int64_t rows = batch * seq, count = model_.stage_rows(rows) * model_.config().d_model;
  stats_ = {};
  const std::vector<parallel::PipelineInstruction>& list = s.ranks[rank_];
  size_t last_backward = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].op == parallel::PipelineOp::Backward) last_backward = i;
  }
  double loss_sum = 0.0;
  bool round_pending = false;  // a backward's data-parallel round still to end
  for (size_t i = 0; i < list.size(); ++i) {
    const parallel::PipelineInstruction& in = list[i];
    const Key key{in.micro_batch, in.chunk};
    const int vs = s.virtual_stage(rank_, in.chunk);
    const int32_t* mb_inputs = inputs + static_cast<int64_t>(in.micro_batch) * rows;
    const int32_t* mb_targets = targets + static_cast<int64_t>(in.micro_batch) * rows;
    const model::Packing mb_packing = packing.at(static_cast<int64_t>(in.micro_batch) * rows);
    // Consecutive message instructions go as one batch; its receives are waited for once the
    // data-parallel round below has ended (the gradient for the previous stage is on its way).
    comm::WorkHandle incoming;
    if (is_message(in.op)) {
      size_t end = i + 1;
      while (end < list.size() && is_message(list[end].op)) ++end;
      incoming = start_messages(i, end, rows, count);
      i = end - 1;
    }
    switch (in.op) {
      case parallel::PipelineOp::Forward:
        loss_sum += forward(key, mb_inputs, mb_targets, batch, seq, grad_scale, mb_packing);
        break;
      case parallel::PipelineOp::Backward: {
        InFlight& f = acquire(key);
        trace::Range range("backward micro-batch", in.micro_batch, chunk_name(in.chunk).c_str());
        // The data-parallel reduction of a unit starts during its last micro-batch's backward.
        dp.begin_micro_batch(in.micro_batch == s.micro_batches - 1);
        const Clock::time_point start = Clock::now();
        model_.backward_chunk(*f.activations, in.chunk, mb_inputs, batch, seq, mb_packing);
        stats_.compute_seconds += seconds_since(start);
        // A reduction round may block (ZeRO-2's reduce-scatter, tied embeddings): it waits until
        // the gradient for the previous stage is on its way, or that stage could wait for us.
        round_pending = i != last_backward;
        if (vs == 0) release(key);  // nothing to send back
        break;
      }
      case parallel::PipelineOp::ReduceGradients: {
        trace::Range range("gradient reduction round");
        const Clock::time_point start = Clock::now();
        recycle(true);
        stats_.wait_seconds += seconds_since(start);
        dp.end_micro_batch(true);
        break;
      }
      default: break;  // messages: started above
    }
    const bool sending_back = batch_sends_back(list, i + 1, key);
    if (round_pending && !sending_back) {
      dp.end_micro_batch(false);
      round_pending = false;
    }
    if (incoming) wait_for(incoming);
  }
  LOOM_CHECK(live_.empty(), "pipeline: activations of " + std::to_string(live_.size()) +
                           " micro-batch chunk(s) are still held after the schedule ended");
  return loss_sum;
}

double PipelineStep::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                                  const model::Packing& packing) {
  const parallel::PipelineSchedule& s = schedule_;
  const int64_t rows = batch * seq, count = model_.stage_rows(rows) * model_.config().d_model;
  const int v = s.virtual_stages;
  if (evaluation_.empty()) {
    evaluation_.resize(v);
    for (InFlight& f : evaluation_) f.activations = std::make_unique<model::Activations>();
  }
  double loss_sum = 0.0;
  for (int c = 0; c < v; ++c) {
    InFlight& f = evaluation_[c];
    for (comm::WorkHandle& send : f.sends) send->wait();
    f.sends.clear();
    const int vs = s.virtual_stage(rank_, c);
    if (vs > 0) {
      const StageMessage in{.recv = model_.chunk_input(*f.activations, c, rows), .count = count,
                            .message = parallel::pipeline_message(s, rank_, {parallel::PipelineOp::RecvForward, 0, c})};
      wait_for(start_stage_messages(pp_, {&in, 1}).front());
    }
    loss_sum += model_.forward_chunk(*f.activations, c, inputs, targets, batch, seq, 0.0f, packing);
    if (vs + 1 < s.total_stages()) {
      const StageMessage out{.send = model_.chunk_output(*f.activations, c), .count = count,
                             .message = parallel::pipeline_message(s, rank_, {parallel::PipelineOp::SendForward, 0, c})};
      f.sends.push_back(start_stage_messages(pp_, {&out, 1}).front());
    }
  }
  for (InFlight& f : evaluation_) {
    for (comm::WorkHandle& send : f.sends) send->wait();
    f.sends.clear();
  }
  // The last stage has the loss; every rank of the pipeline gets it.
  return share_loss(pp_, loss_sum, s.rank_of(s.total_stages() - 1));
}

}  // namespace loom::parallel
