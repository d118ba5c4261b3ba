#include "loom/parallel/pipeline/pipeline_schedule.h"

#include <algorithm>
#include <utility>

#include "loom/core/error.h"

namespace loom::parallel {

std::string pipeline_op_name(PipelineOp op) {
  switch (op) {
    case PipelineOp::RecvForward: return "recv_forward";
    case PipelineOp::Forward: return "forward";
    case PipelineOp::SendForward: return "send_forward";
    case PipelineOp::RecvBackward: return "recv_backward";
    case PipelineOp::Backward: return "backward";
    case PipelineOp::SendBackward: return "send_backward";
    case PipelineOp::ReduceGradients: return "reduce_gradients";
  }
  return "?";
}

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  return config::parse_name<PipelineScheduleKind>(name, "parallel.pipeline_schedule");
}

std::string pipeline_schedule_name(PipelineScheduleKind kind) { return config::to_string(kind); }

PipelineMessage pipeline_message(const PipelineSchedule& s, int rank, const PipelineInstruction& in) {
  const int vs = s.virtual_stage(rank, in.chunk);
  auto tag = [&](bool forward, int sender_chunk) {
    return (in.micro_batch * s.virtual_stages + sender_chunk) * 2 + (forward ? 0 : 1);
  };
  switch (in.op) {
    case PipelineOp::SendForward: return {s.rank_of(vs + 1), tag(true, in.chunk)};
    case PipelineOp::RecvForward: return {s.rank_of(vs - 1), tag(true, s.chunk_of(vs - 1))};
    case PipelineOp::SendBackward: return {s.rank_of(vs - 1), tag(false, in.chunk)};
    case PipelineOp::RecvBackward: return {s.rank_of(vs + 1), tag(false, s.chunk_of(vs + 1))};
    default: break;
  }
  throw Error("pipeline_message: " + pipeline_op_name(in.op) + " is not a message");
}

namespace {

// Appends the receive, the pass and the send of one chunk's forward or backward on `rank`.
void add_pass(const PipelineSchedule& s, std::vector<PipelineInstruction>& list, int rank, bool forward,
              int micro_batch, int chunk) {
  if (forward) {
    if (!s.first_stage(rank, chunk)) list.push_back({PipelineOp::RecvForward, micro_batch, chunk});
    list.push_back({PipelineOp::Forward, micro_batch, chunk});
    if (!s.last_stage(rank, chunk)) list.push_back({PipelineOp::SendForward, micro_batch, chunk});
  } else {
    if (!s.last_stage(rank, chunk)) list.push_back({PipelineOp::RecvBackward, micro_batch, chunk});
    list.push_back({PipelineOp::Backward, micro_batch, chunk});
    if (!s.first_stage(rank, chunk)) list.push_back({PipelineOp::SendBackward, micro_batch, chunk});
  }
}

void build_gpipe(PipelineSchedule& s) {
  for (int r = 0; r < s.stages; ++r) {
    for (int mb = 0; mb < s.micro_batches; ++mb) add_pass(s, s.ranks[r], r, true, mb, 0);
    for (int mb = 0; mb < s.micro_batches; ++mb) add_pass(s, s.ranks[r], r, false, mb, 0);
  }
}

void build_1f1b(PipelineSchedule& s) {
  const int p = s.stages, m = s.micro_batches;
  for (int r = 0; r < p; ++r) {
    // Rank r starts its first backward after p - r - 1 extra forwards have filled the pipe below it.
    const int warmup = std::min(p - r - 1, m);
    std::vector<PipelineInstruction>& list = s.ranks[r];
    for (int mb = 0; mb < warmup; ++mb) add_pass(s, list, r, true, mb, 0);
    for (int i = 0; i < m - warmup; ++i) {
      add_pass(s, list, r, true, warmup + i, 0);
      add_pass(s, list, r, false, i, 0);
    }
    for (int mb = m - warmup; mb < m; ++mb) add_pass(s, list, r, false, mb, 0);
  }
}

// Megatron-LM's interleaved 1F1B: the k-th forward (or backward) pass of a rank handles
// micro-batch group k / (p v), chunk (k / p) % v (reversed for backward), micro-batch k % p of
// the group. A rank runs its passes in steps (warm-up: one forward; steady state: one forward
// and one backward; cool-down: one backward) and exchanges with both neighbours once between
// two steps, in one batch: the sends of the step just run (its output forward, its input's
// gradient back) and the receives of the next step's passes (Megatron's
// send_forward_backward_recv_forward_backward). The ranks' steps then meet in lockstep, a
// message's send and recv in batches that run together, so nothing deadlocks where a send waits
// for its recv (NCCL; check_rendezvous in pipeline_rendezvous.h proves it per shape). Within a batch forward messages come before backward ones on every
// rank, so that with 2 stages, where both neighbours are the same rank, the messages between
// two ranks pair in issue order (NCCL has no tags).
void build_interleaved(PipelineSchedule& s) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages, total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    const int chunk = (k % (p * v)) / p;
    return forward ? chunk : v - 1 - chunk;
  };
  auto micro_batch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  using Pass = std::pair<bool, int>;  // (forward, k)
  for (int r = 0; r < p; ++r) {
    const int warmup = m == p ? total : std::min(total, (p - r - 1) * 2 + (v - 1) * p);
    std::vector<std::vector<Pass>> steps;
    for (int k = 0; k < warmup; ++k) steps.push_back({{true, k}});
    for (int i = 0; i < total - warmup; ++i) steps.push_back({{true, warmup + i}, {false, i}});
    for (int k = total - warmup; k < total; ++k) steps.push_back({{false, k}});
    std::vector<PipelineInstruction>& list = s.ranks[r];
    // The messages of `step`'s passes of one kind (sends or receives), forward first.
    auto messages = [&](const std::vector<Pass>& step, bool sends) {
      for (const auto& [forward, k] : step) {
        const int mb = micro_batch_of(k), chunk = chunk_of(k, forward);
        const bool to_or_from_next = forward == sends;  // a send forward or a recv of a gradient
        if (to_or_from_next ? s.last_stage(r, chunk) : s.first_stage(r, chunk)) continue;
        const PipelineOp op = forward ? (sends ? PipelineOp::SendForward : PipelineOp::RecvForward)
                                      : (sends ? PipelineOp::SendBackward : PipelineOp::RecvBackward);
        list.push_back({op, mb, chunk});
      }
    };
    for (size_t j = 0; j < steps.size(); ++j) {
      if (j == 0) messages(steps[j], false);
      for (const auto& [forward, k] : steps[j]) {
        list.push_back({forward ? PipelineOp::Forward : PipelineOp::Backward, micro_batch_of(k), chunk_of(k, forward)});
      }
      messages(steps[j], true);
      if (j + 1 < steps.size()) messages(steps[j + 1], false);
    }
  }
}

}  // namespace

PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int stages, int micro_batches, int virtual_stages) {
  const std::string shape = "pipeline schedule " + pipeline_schedule_name(kind) + " with " + std::to_string(stages) +
                            " stages, " + std::to_string(micro_batches) + " micro-batches and " +
                            std::to_string(virtual_stages) + " virtual stages per rank: ";
  LOOM_CHECK(stages >= 1, shape + "the number of stages must be >= 1");
  LOOM_CHECK(micro_batches >= 1, shape + "the number of micro-batches must be >= 1");
  LOOM_CHECK(virtual_stages >= 1, shape + "virtual stages must be >= 1");
  if (kind == PipelineScheduleKind::Interleaved) {
    LOOM_CHECK(stages > 1, shape + "interleaving needs at least 2 pipeline stages (use 1f1b or gpipe with pp = 1)");
    LOOM_CHECK(micro_batches % stages == 0, shape + "interleaving needs the micro-batches to be a multiple of the stages (" +
                                           std::to_string(stages) + "); e.g. " +
                                           std::to_string((micro_batches / stages + 1) * stages) + " micro-batches");
  } else {
    LOOM_CHECK(virtual_stages == 1, shape + "only the interleaved schedule runs several virtual stages per rank "
                                       "(set parallel.virtual_stages = 1 or parallel.pipeline_schedule = interleaved)");
  }
  PipelineSchedule s;
  s.kind = kind;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.virtual_stages = virtual_stages;
  s.ranks.resize(stages);
  switch (kind) {
    case PipelineScheduleKind::GPipe: build_gpipe(s); break;
    case PipelineScheduleKind::OneFOneB: build_1f1b(s); break;
    case PipelineScheduleKind::Interleaved: build_interleaved(s); break;
  }
  for (auto& list : s.ranks) list.push_back({PipelineOp::ReduceGradients, 0, 0});
  return s;
}

}  // namespace loom::parallel
