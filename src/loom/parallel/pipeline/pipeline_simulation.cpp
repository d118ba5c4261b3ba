#include "loom/parallel/pipeline/pipeline_simulation.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "loom/core/error.h"
#include "loom/parallel/pipeline/pipeline_rendezvous.h"

namespace loom::parallel {

double PipelineSimulation::bubble_fraction() const {
  double sum = 0.0;
  for (size_t r = 0; r < busy.size(); ++r) sum += idle[r] / busy[r];
  return busy.empty() ? 0.0 : sum / static_cast<double>(busy.size());
}

namespace {

std::string describe(int rank, size_t index, const PipelineInstruction& in) {
  return "rank " + std::to_string(rank) + " instruction " + std::to_string(index) + " (" +
         pipeline_op_name(in.op) + " micro-batch " + std::to_string(in.micro_batch) + " chunk " +
         std::to_string(in.chunk) + ")";
}

// The static rules of one rank's list: each pass once, in order, with its messages around it.
void check_list(const PipelineSchedule& s, int rank) {
  const std::vector<PipelineInstruction>& list = s.ranks[rank];
  const std::string where = pipeline_schedule_name(s.kind) + " schedule, ";
  // Per (micro-batch, chunk): the index of each op, -1 while absent.
  std::map<std::pair<int, int>, std::array<int, 7>> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const PipelineInstruction& in = list[i];
    if (in.op == PipelineOp::ReduceGradients) {
      LOOM_CHECK(i + 1 == list.size(), where + describe(rank, i, in) + ": the gradient reduction must come last");
      continue;
    }
    LOOM_CHECK(in.micro_batch >= 0 && in.micro_batch < s.micro_batches && in.chunk >= 0 && in.chunk < s.virtual_stages,
          where + describe(rank, i, in) + ": micro-batch or chunk out of range");
    auto [it, fresh] = seen.try_emplace({in.micro_batch, in.chunk});
    if (fresh) it->second.fill(-1);
    int& slot = it->second[static_cast<int>(in.op)];
    LOOM_CHECK(slot < 0, where + describe(rank, i, in) + ": appears twice");
    slot = static_cast<int>(i);
  }
  LOOM_CHECK(!list.empty() && list.back().op == PipelineOp::ReduceGradients,
        where + "rank " + std::to_string(rank) + " never reduces its gradients");
  for (int mb = 0; mb < s.micro_batches; ++mb) {
    for (int c = 0; c < s.virtual_stages; ++c) {
      const std::string what = where + "rank " + std::to_string(rank) + " micro-batch " + std::to_string(mb) +
                               " chunk " + std::to_string(c) + ": ";
      auto it = seen.find({mb, c});
      LOOM_CHECK(it != seen.end(), what + "never runs");
      auto at = [&](PipelineOp op) { return it->second[static_cast<int>(op)]; };
      const int forward = at(PipelineOp::Forward), backward = at(PipelineOp::Backward);
      LOOM_CHECK(forward >= 0 && backward >= 0, what + "needs one forward and one backward");
      LOOM_CHECK(forward < backward, what + "its backward comes before its forward");
      const bool first = s.first_stage(rank, c), last = s.last_stage(rank, c);
      auto require = [&](PipelineOp op, bool needed, bool before, int pass) {
        const int index = at(op);
        LOOM_CHECK((index >= 0) == needed, what + pipeline_op_name(op) + (needed ? " is missing" : " is not expected"));
        if (needed) LOOM_CHECK(before ? index < pass : index > pass, what + pipeline_op_name(op) + " is out of order");
      };
      require(PipelineOp::RecvForward, !first, true, forward);
      require(PipelineOp::SendForward, !last, false, forward);
      require(PipelineOp::RecvBackward, !last, true, backward);
      require(PipelineOp::SendBackward, !first, false, backward);
    }
  }
}

}  // namespace

PipelineSimulation simulate_pipeline(const PipelineSchedule& s, PipelineCosts costs) {
  const int p = s.stages;
  LOOM_CHECK(static_cast<int>(s.ranks.size()) == p, "pipeline schedule has " + std::to_string(s.ranks.size()) +
                                                   " instruction lists for " + std::to_string(p) + " stages");
  for (int r = 0; r < p; ++r) check_list(s, r);

  const double forward_cost = costs.forward / s.virtual_stages, backward_cost = costs.backward / s.virtual_stages;
  PipelineSimulation sim;
  sim.busy.assign(p, 0.0);
  sim.idle.assign(p, 0.0);
  sim.peak_in_flight.assign(p, 0);
  sim.timeline.resize(p);
  std::vector<double> clock(p, 0.0);
  std::vector<size_t> next(p, 0);
  std::vector<int> in_flight(p, 0);
  // Messages sent and not yet received: (from, to, tag) -> time sent.
  std::map<std::tuple<int, int, int>, double> mailbox;

  // A message as (from, to, tag).
  auto message = [&](int rank, const PipelineInstruction& in) {
    const PipelineMessage m = pipeline_message(s, rank, in);
    const bool send = in.op == PipelineOp::SendForward || in.op == PipelineOp::SendBackward;
    return send ? std::tuple{rank, m.peer, m.tag} : std::tuple{m.peer, rank, m.tag};
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < s.ranks[r].size()) {
        const PipelineInstruction& in = s.ranks[r][next[r]];
        if (in.op == PipelineOp::SendForward || in.op == PipelineOp::SendBackward) {
          const auto key = message(r, in);
          LOOM_CHECK(mailbox.emplace(key, clock[r]).second, describe(r, next[r], in) + ": the same message is sent twice");
        } else if (in.op == PipelineOp::RecvForward || in.op == PipelineOp::RecvBackward) {
          auto it = mailbox.find(message(r, in));
          if (it == mailbox.end()) break;  // waits
          clock[r] = std::max(clock[r], it->second);
          mailbox.erase(it);
        } else if (in.op == PipelineOp::Forward || in.op == PipelineOp::Backward) {
          const bool forward = in.op == PipelineOp::Forward;
          const double cost = forward ? forward_cost : backward_cost;
          sim.timeline[r].push_back({clock[r], clock[r] + cost, in});
          clock[r] += cost;
          sim.busy[r] += cost;
          in_flight[r] += forward ? 1 : -1;
          sim.peak_in_flight[r] = std::max(sim.peak_in_flight[r], in_flight[r]);
        }
        ++next[r];
        progress = true;
      }
    }
  }
  std::string blocked;
  for (int r = 0; r < p; ++r) {
    if (next[r] < s.ranks[r].size()) blocked += "\n  " + describe(r, next[r], s.ranks[r][next[r]]);
  }
  LOOM_CHECK(blocked.empty(), pipeline_schedule_name(s.kind) + " schedule deadlocks; waiting:" + blocked);
  LOOM_CHECK(mailbox.empty(), pipeline_schedule_name(s.kind) + " schedule sends " + std::to_string(mailbox.size()) +
                             " message(s) nobody receives");
  check_rendezvous(s);  // and where sends wait for their recv (NCCL)
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < p; ++r) sim.idle[r] = sim.makespan - sim.busy[r];
  return sim;
}

std::string render_pipeline_timeline(const PipelineSchedule& s, const PipelineSimulation& sim, PipelineCosts costs) {
  const double unit = costs.forward / s.virtual_stages;
  const int columns = static_cast<int>(std::ceil(sim.makespan / unit - 1e-9));
  const int width = s.virtual_stages > 1 ? 4 : 3;
  auto base36 = [](int n) {
    const char* digits = "0123456789abcdefghijklmnopqrstuvwxyz";
    std::string out;
    do {
      out.insert(out.begin(), digits[n % 36]);
      n /= 36;
    } while (n > 0);
    return out;
  };
  std::ostringstream out;
  out << pipeline_schedule_name(s.kind) << ": " << s.stages << " stages, " << s.micro_batches << " micro-batches";
  if (s.virtual_stages > 1) out << ", " << s.virtual_stages << " virtual stages per rank";
  out << " (forward " << costs.forward << ", backward " << costs.backward << " per micro-batch and stage)\n";
  for (int r = 0; r < s.stages; ++r) {
    std::vector<std::string> cells(columns, std::string(width - 1, '.') + " ");
    for (const PipelineSlot& slot : sim.timeline[r]) {
      const int begin = static_cast<int>(std::lround(slot.start / unit));
      const int end = static_cast<int>(std::lround(slot.end / unit));
      std::string label(1, slot.instruction.op == PipelineOp::Forward ? 'F' : 'B');
      label += base36(slot.instruction.micro_batch);
      if (s.virtual_stages > 1) label += static_cast<char>('a' + slot.instruction.chunk);
      for (int c = begin; c < end && c < columns; ++c) {
        std::string text = c == begin ? label : std::string(label.size(), '=');
        text.resize(width - 1, c == begin ? ' ' : '=');
        cells[c] = text + " ";
      }
    }
    out << "stage " << r << " |";
    for (const std::string& cell : cells) out << cell;
    out << "\n";
  }
  out << "per stage: busy, idle, bubble (idle / busy), peak activations held (micro-batch chunks)\n";
  for (int r = 0; r < s.stages; ++r) {
    char line[160];
    std::snprintf(line, sizeof line, "stage %d: busy %.1f, idle %.1f, bubble %.3f, peak %d\n", r, sim.busy[r],
                  sim.idle[r], sim.idle[r] / sim.busy[r], sim.peak_in_flight[r]);
    out << line;
  }
  const double theory = static_cast<double>(s.stages - 1) / (s.virtual_stages * s.micro_batches);
  char summary[160];
  std::snprintf(summary, sizeof summary, "bubble fraction %.4f (theory (p - 1) / (v m) = %.4f)\n", sim.bubble_fraction(),
                theory);
  out << summary;
  return out.str();
}

}  // namespace loom::parallel
