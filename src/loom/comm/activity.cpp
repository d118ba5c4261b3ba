#include "loom/comm/activity.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

namespace loom::comm::activity {

namespace {

struct Entry {
  uint64_t id = 0;
  Operation operation;
};

struct RankRecord {
  std::vector<Entry> waiting;
  uint64_t changes = 0;
  WallClock::time_point last_change{};
};

struct Registry {
  std::atomic<bool> enabled{false};
  std::mutex mutex;
  std::map<int, RankRecord> ranks;
  uint64_t next_id = 1;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: rank threads may outlive statics
  return *instance;
}

}  // namespace

void enable() { registry().enabled.store(true, std::memory_order_release); }
bool enabled() { return registry().enabled.load(std::memory_order_acquire); }

Scope::Scope(int world_rank, std::string_view op, std::string_view group, int64_t seq) {
  Registry& r = registry();
  if (!r.enabled.load(std::memory_order_acquire)) return;
  const auto now = WallClock::now();
  std::lock_guard lock(r.mutex);
  RankRecord& record = r.ranks[world_rank];
  id_ = r.next_id++;
  world_rank_ = world_rank;
  record.waiting.push_back({id_, Operation{std::string(op), std::string(group), seq, now}});
  ++record.changes;
  record.last_change = now;
}

Scope::~Scope() {
  if (world_rank_ < 0) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  RankRecord& record = r.ranks[world_rank_];
  std::erase_if(record.waiting, [&](const Entry& e) { return e.id == id_; });
  ++record.changes;
  record.last_change = WallClock::now();
}

RankActivity snapshot(int world_rank) {
  Registry& r = registry();
  RankActivity out;
  std::lock_guard lock(r.mutex);
  auto it = r.ranks.find(world_rank);
  if (it == r.ranks.end()) return out;
  for (const Entry& e : it->second.waiting) out.waiting.push_back(e.operation);
  out.changes = it->second.changes;
  out.last_change = it->second.last_change;
  return out;
}

}  // namespace loom::comm::activity
