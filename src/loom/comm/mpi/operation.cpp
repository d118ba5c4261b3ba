#include "loom/comm/mpi/operation.h"

#include <mutex>

namespace loom::comm::mpi_detail {

namespace {

std::mutex& keep_alive_mutex() {
  static std::mutex mutex;
  return mutex;
}
// Never destroyed: objects in it may be written by MPI until the process exits.
std::vector<std::shared_ptr<void>>& kept_alive() {
  static auto* objects = new std::vector<std::shared_ptr<void>>();
  return *objects;
}

std::atomic<bool> g_stuck{false};
std::mutex g_stuck_mutex;
std::string g_stuck_what;

int64_t hash_counts(const std::vector<int64_t>& counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the 8 bytes of each count
  for (int64_t c : counts) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(c) >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h >> 1);  // non-negative, so that -h cannot overflow
}

}  // namespace

Descriptor make_descriptor(const CollectiveOp& op) {
  const CollectiveCall& call = op.call;
  Descriptor d{};
  d[kKind] = static_cast<int64_t>(call.kind);
  d[kDType] = static_cast<int64_t>(call.dtype);
  d[kCount] = call.count;
  d[kReduce] = -1;
  d[kRoot] = -1;
  d[kCountsHash] = 0;
  switch (call.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::ReduceScatter:
      d[kReduce] = static_cast<int64_t>(call.reduce_op);
      break;
    case CollectiveKind::Reduce:
      d[kReduce] = static_cast<int64_t>(call.reduce_op);
      d[kRoot] = call.root;
      break;
    case CollectiveKind::Broadcast:
      d[kRoot] = call.root;
      break;
    case CollectiveKind::AllGatherV: {
      int64_t total = 0;
      for (int64_t c : call.counts) total += c;
      d[kCount] = total;
      d[kCountsHash] = hash_counts(call.counts);
      break;
    }
    case CollectiveKind::AllToAllV:
      d[kCount] = -1;  // the per-pair counts are checked separately
      break;
    case CollectiveKind::Barrier:
    case CollectiveKind::Split:
      d[kDType] = -1;
      d[kCount] = -1;
      break;
    default:
      break;
  }
  d[kInvalid] = op.invalid.empty() ? 0 : 1;
  return d;
}

std::string describe_descriptor(const Descriptor& d) {
  if (d[kKind] < static_cast<int64_t>(CollectiveKind::AllReduce) ||
      d[kKind] > static_cast<int64_t>(CollectiveKind::Split)) {
    return "unknown operation " + std::to_string(d[kKind]);
  }
  const auto kind = static_cast<CollectiveKind>(d[kKind]);
  std::string out = collective_name(kind);
  std::vector<std::string> parts;
  if (d[kDType] >= 0) {
    std::string part = dtype_name(static_cast<DType>(d[kDType]));
    if (d[kCount] >= 0) part += " x " + std::to_string(d[kCount]);
    parts.push_back(part);
  }
  if (kind == CollectiveKind::AllGatherV) parts.push_back("counts hash " + std::to_string(d[kCountsHash]));
  if (d[kReduce] >= 0) parts.push_back(reduce_op_name(static_cast<ReduceOp>(d[kReduce])));
  if (d[kRoot] >= 0) parts.push_back("root " + std::to_string(d[kRoot]));
  if (d[kInvalid] != 0) parts.push_back("invalid arguments");
  if (!parts.empty()) {
    out += " (";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
    out += ")";
  }
  return out;
}

std::string CollectiveOp::describe() const {
  Descriptor d = make_descriptor(*this);
  d[kInvalid] = 0;
  std::string text = describe_descriptor(d);
  const size_t paren = text.find(" (");
  const std::string numbered = " #" + std::to_string(seq);
  if (paren == std::string::npos) return text + numbered;
  return text.substr(0, paren) + numbered + text.substr(paren);
}

void keep_alive(std::shared_ptr<void> object) {
  std::lock_guard<std::mutex> lock(keep_alive_mutex());
  kept_alive().push_back(std::move(object));
}

void mark_communication_thread_stuck(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_stuck_mutex);
  g_stuck_what = what;
  g_stuck = true;
}

bool communication_thread_stuck(std::string* what) {
  if (!g_stuck.load()) return false;
  if (what != nullptr) {
    std::lock_guard<std::mutex> lock(g_stuck_mutex);
    *what = g_stuck_what;
  }
  return true;
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace loom::comm::mpi_detail
