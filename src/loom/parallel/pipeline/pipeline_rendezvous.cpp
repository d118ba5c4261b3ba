#include "loom/parallel/pipeline/pipeline_rendezvous.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.h"

namespace loom::parallel {

namespace {

// One message instruction and the other end it pairs with.
struct Op {
  int rank = 0;
  size_t index = 0;  // in the rank's list
  int batch = 0;     // of the rank's batches
  int partner = -1;  // the op at the other end
  bool done = false;
};

struct Batch {
  size_t begin = 0, end = 0;  // instructions [begin, end)
  std::vector<int> ops;
  bool receives = false;
};

class Rendezvous {
 public:
  explicit Rendezvous(const PipelineSchedule& s) : s_(s), batches_(s.stages), batch_at_(s.stages) {
    for (int r = 0; r < s.stages; ++r) split_batches(r);
    pair_messages();
  }

  void run() {
    const int p = s_.stages;
    std::vector<size_t> cpu(p, 0);
    std::vector<int> issued(p, 0), head(p, 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < p; ++r) progress = advance(r, cpu[r], issued[r], head[r]) || progress;
      for (int r = 0; r < p; ++r) {
        while (head[r] < issued[r] && complete(r, head[r], head, issued)) {
          ++head[r];
          progress = true;
        }
      }
    }
    std::string blocked;
    for (int r = 0; r < p; ++r) {
      if (cpu[r] == s_.ranks[r].size() && head[r] == issued[r]) continue;
      blocked += "\n  rank " + std::to_string(r) + ": ";
      if (head[r] == issued[r]) {
        blocked += describe(r, cpu[r]) + " not reached";
        continue;
      }
      for (int id : batches_[r][head[r]].ops) {
        if (ops_[id].done) continue;
        const Op& other = ops_[ops_[id].partner];
        blocked += describe(r, ops_[id].index) + " waits for " + describe(other.rank, other.index);
        break;
      }
    }
    LOOM_CHECK(blocked.empty(), where() + "deadlocks where a send waits for its recv (NCCL); waiting:" + blocked);
  }

 private:
  std::string where() const {
    return pipeline_schedule_name(s_.kind) + " schedule (" + std::to_string(s_.stages) + " stages, " +
           std::to_string(s_.micro_batches) + " micro-batches, " + std::to_string(s_.virtual_stages) +
           " virtual stages): ";
  }
  std::string describe(int rank, size_t index) const {
    const PipelineInstruction& in = s_.ranks[rank][index];
    return "rank " + std::to_string(rank) + " instruction " + std::to_string(index) + " (" + pipeline_op_name(in.op) +
           " micro-batch " + std::to_string(in.micro_batch) + " chunk " + std::to_string(in.chunk) + ")";
  }

  void split_batches(int r) {
    const std::vector<PipelineInstruction>& list = s_.ranks[r];
    batch_at_[r].assign(list.size(), -1);
    for (size_t i = 0; i < list.size(); ++i) {
      if (!is_message(list[i].op)) continue;
      Batch b;
      b.begin = i;
      for (; i < list.size() && is_message(list[i].op); ++i) {
        batch_at_[r][i] = static_cast<int>(batches_[r].size());
        b.receives = b.receives || !is_send(list[i].op);
        b.ops.push_back(static_cast<int>(ops_.size()));
        ops_.push_back({.rank = r, .index = i, .batch = static_cast<int>(batches_[r].size())});
      }
      b.end = i;
      --i;
      batches_[r].push_back(std::move(b));
    }
  }

  // The k-th send from a to b pairs with b's k-th recv from a (issue order, no tags).
  void pair_messages() {
    std::map<std::pair<int, int>, std::vector<int>> sends, recvs;  // (from, to) -> ops in issue order
    for (int id = 0; id < static_cast<int>(ops_.size()); ++id) {
      const Op& op = ops_[id];
      const PipelineInstruction& in = s_.ranks[op.rank][op.index];
      const int peer = pipeline_message(s_, op.rank, in).peer;
      if (is_send(in.op)) {
        sends[{op.rank, peer}].push_back(id);
      } else {
        recvs[{peer, op.rank}].push_back(id);
      }
    }
    for (auto& [pair, list] : recvs) sends.try_emplace(pair);
    for (const auto& [pair, sent] : sends) {
      const std::vector<int>& received = recvs[pair];
      const std::string between = "rank " + std::to_string(pair.first) + " sends " + std::to_string(sent.size()) +
                                  " message(s) to rank " + std::to_string(pair.second) + ", which receives " +
                                  std::to_string(received.size());
      LOOM_CHECK(sent.size() == received.size(), where() + between);
      for (size_t k = 0; k < sent.size(); ++k) {
        Op& send = ops_[sent[k]];
        Op& recv = ops_[received[k]];
        const int send_tag = pipeline_message(s_, send.rank, s_.ranks[send.rank][send.index]).tag;
        const int recv_tag = pipeline_message(s_, recv.rank, s_.ranks[recv.rank][recv.index]).tag;
        LOOM_CHECK(send_tag == recv_tag, where() + "messages pair in issue order, and " + describe(send.rank, send.index) +
                                             " would land in " + describe(recv.rank, recv.index));
        send.partner = received[k];
        recv.partner = sent[k];
      }
    }
  }

  // Moves rank r's list on until it waits; whether it moved.
  bool advance(int r, size_t& cpu, int& issued, int head) {
    const std::vector<PipelineInstruction>& list = s_.ranks[r];
    const size_t start = cpu;
    const int issued_before = issued;
    while (cpu < list.size()) {
      const PipelineOp op = list[cpu].op;
      if (is_message(op)) {
        const int b = batch_at_[r][cpu];
        issued = std::max(issued, b + 1);
        if (batches_[r][b].receives && head <= b) break;  // its data is needed next
        cpu = batches_[r][b].end;
      } else if (op == PipelineOp::ReduceGradients) {
        if (head < issued) break;  // every send must have completed
        ++cpu;
      } else {
        ++cpu;
      }
    }
    return cpu != start || issued != issued_before;
  }

  // Pairs the ops of rank r's running batch whose other end runs too; whether all are done.
  bool complete(int r, int batch, const std::vector<int>& head, const std::vector<int>& issued) {
    bool all = true;
    for (int id : batches_[r][batch].ops) {
      Op& op = ops_[id];
      if (op.done) continue;
      Op& other = ops_[op.partner];
      if (head[other.rank] == other.batch && other.batch < issued[other.rank]) {
        op.done = other.done = true;
      } else {
        all = false;
      }
    }
    return all;
  }

  const PipelineSchedule& s_;
  std::vector<Op> ops_;
  std::vector<std::vector<Batch>> batches_;   // per rank
  std::vector<std::vector<int>> batch_at_;    // per rank and instruction: its batch, -1 if none
};

}  // namespace

void check_rendezvous(const PipelineSchedule& schedule) {
  LOOM_CHECK(static_cast<int>(schedule.ranks.size()) == schedule.stages,
             "pipeline schedule has " + std::to_string(schedule.ranks.size()) + " instruction lists for " +
                 std::to_string(schedule.stages) + " stages");
  Rendezvous(schedule).run();
}

}  // namespace loom::parallel
