#include "loom/ops/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::ops {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "rank-";
constexpr std::string_view kSuffix = ".json";

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", s);
  return text;
}

std::string timeout_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

std::string where_text(const HeartbeatRecord& r) {
  return r.phase + (r.step > 0 ? " of step " + std::to_string(r.step) : "");
}

std::string collective_text(const HeartbeatCollective& c) {
  return c.op + " on group '" + c.group + "' #" + std::to_string(c.seq);
}

}  // namespace

std::string heartbeat_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.json", rank);
  return name;
}

std::string serialize_heartbeat(const HeartbeatRecord& r) {
  nlohmann::json j = {{"rank", r.rank},
                      {"world_size", r.world_size},
                      {"pid", r.pid},
                      {"host", r.host},
                      {"attempt", r.attempt},
                      {"step", r.step},
                      {"phase", r.phase},
                      {"time", r.time},
                      {"progress_time", r.progress_time},
                      {"collective", nullptr},
                      {"finished", r.finished}};
  if (r.collective) {
    j["collective"] = {{"op", r.collective->op},
                       {"group", r.collective->group},
                       {"seq", r.collective->seq},
                       {"since", r.collective->since}};
  }
  return j.dump() + "\n";
}

std::optional<HeartbeatRecord> parse_heartbeat(std::string_view text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    HeartbeatRecord r;
    r.rank = j.at("rank").get<int>();
    r.world_size = j.at("world_size").get<int>();
    r.pid = j.at("pid").get<int64_t>();
    r.host = j.at("host").get<std::string>();
    r.attempt = j.at("attempt").get<int>();
    r.step = j.at("step").get<int64_t>();
    r.phase = j.at("phase").get<std::string>();
    r.time = j.at("time").get<double>();
    r.progress_time = j.at("progress_time").get<double>();
    r.finished = j.at("finished").get<bool>();
    const nlohmann::json& c = j.at("collective");
    if (!c.is_null()) {
      r.collective = HeartbeatCollective{c.at("op").get<std::string>(), c.at("group").get<std::string>(),
                                         c.at("seq").get<int64_t>(), c.at("since").get<double>()};
    }
    if (r.rank < 0 || r.world_size < 1 || r.rank >= r.world_size) return std::nullopt;
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void write_heartbeat(const std::string& dir, const HeartbeatRecord& record) {
  const std::string name = heartbeat_file_name(record.rank);
  const std::string target = (fs::path(dir) / name).string();
  // Rewritten every few seconds and worthless after a crash: atomic, but not flushed to disk.
  write_file_atomic(target, serialize_heartbeat(record), Durability::Unsynced);
}

std::vector<HeartbeatRecord> read_heartbeats(const std::string& dir, int attempt) {
  std::map<int, HeartbeatRecord> by_rank;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    std::ifstream in(it->path(), std::ios::binary);
    if (!in) continue;  // removed meanwhile
    std::ostringstream text;
    text << in.rdbuf();
    std::optional<HeartbeatRecord> record = parse_heartbeat(text.str());
    if (record && record->attempt == attempt) by_rank[record->rank] = std::move(*record);
  }
  std::vector<HeartbeatRecord> out;
  for (auto& [rank, record] : by_rank) out.push_back(std::move(record));
  return out;
}

void clear_heartbeats(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if ((name.starts_with(kPrefix) && name.ends_with(kSuffix)) || name.starts_with(".rank-")) {
      doomed.push_back(it->path());
    }
  }
  for (const fs::path& p : doomed) fs::remove(p, ec);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ranks[i]);
  }
  return out;
}

std::optional<std::string> diagnose_hang(const std::vector<HeartbeatRecord>& records, double now, double started,
                                         double timeout_s) {
  if (timeout_s <= 0.0) return std::nullopt;
  const bool past_startup = now - started > timeout_s;
  if (records.empty()) {
    if (!past_startup) return std::nullopt;
    return "no rank wrote a heartbeat within " + seconds(now - started) + " s of the start (hang timeout " +
           timeout_text(timeout_s) + " s); is the command a `loom train`, and does the launcher pass " +
           kHeartbeatDirEnv + " to its ranks?";
  }
  int world_size = 0;
  for (const HeartbeatRecord& r : records) world_size = std::max(world_size, r.world_size);
  std::vector<int> missing;
  for (int rank = 0; rank < world_size; ++rank) {
    if (std::none_of(records.begin(), records.end(), [&](const HeartbeatRecord& r) { return r.rank == rank; })) {
      missing.push_back(rank);
    }
  }
  double worst = 0.0;
  for (const HeartbeatRecord& r : records) {
    if (!r.finished && r.phase != "done") worst = std::max(worst, now - r.progress_time);
  }
  const bool stuck = worst > timeout_s;
  const bool absent = !missing.empty() && past_startup;
  if (!stuck && !absent) return std::nullopt;

  std::string text = stuck ? "no progress for " + seconds(worst) + " s (hang timeout " + timeout_text(timeout_s) + " s)"
                           : "not every rank reported within " + seconds(now - started) + " s (hang timeout " +
                                 timeout_text(timeout_s) + " s)";
  std::vector<std::string> parts;
  // Ranks outside any collective first: the ones the others wait for.
  for (const HeartbeatRecord& r : records) {
    if (r.collective || r.finished || r.phase == "done") continue;
    const double idle = now - r.progress_time;
    parts.push_back("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + " on " + r.host + ") " +
                    (idle > timeout_s ? "stuck for " + seconds(idle) + " s in " : "busy in ") + where_text(r) +
                    ", not in a collective");
  }
  // Then the ranks waiting in each collective, grouped.
  std::map<std::tuple<std::string, std::string, int64_t>, std::vector<const HeartbeatRecord*>> waiting;
  for (const HeartbeatRecord& r : records) {
    if (r.collective) waiting[{r.collective->group, r.collective->op, r.collective->seq}].push_back(&r);
  }
  for (const auto& [key, members] : waiting) {
    std::vector<int> ranks;
    double longest = 0.0;
    std::vector<int64_t> steps;
    for (const HeartbeatRecord* r : members) {
      ranks.push_back(r->rank);
      longest = std::max(longest, now - r->collective->since);
      if (std::find(steps.begin(), steps.end(), r->step) == steps.end()) steps.push_back(r->step);
    }
    std::string part = rank_list(ranks) + " waiting for " + seconds(longest) + " s in " +
                       collective_text(*members.front()->collective);
    if (steps.size() == 1 && steps.front() > 0) part += " (step " + std::to_string(steps.front()) + ")";
    parts.push_back(part);
  }
  std::vector<int> done;
  for (const HeartbeatRecord& r : records) {
    if (r.finished || r.phase == "done") done.push_back(r.rank);
  }
  if (!done.empty()) parts.push_back(rank_list(done) + " done");
  if (!missing.empty()) parts.push_back(rank_list(missing) + " never wrote a heartbeat");
  for (size_t i = 0; i < parts.size(); ++i) text += (i == 0 ? ": " : "; ") + parts[i];
  return text;
}

std::optional<std::string> diagnose_dead_ranks(const std::vector<HeartbeatRecord>& records, const std::string& host,
                                               const std::function<bool(int64_t pid)>& alive) {
  std::map<int64_t, std::vector<const HeartbeatRecord*>> dead;  // by pid
  for (const HeartbeatRecord& r : records) {
    if (r.host != host || r.finished || r.phase == "done" || r.pid <= 0) continue;
    if (!alive(r.pid)) dead[r.pid].push_back(&r);
  }
  if (dead.empty()) return std::nullopt;
  std::string text;
  for (const auto& [pid, members] : dead) {
    std::vector<int> ranks;
    for (const HeartbeatRecord* r : members) ranks.push_back(r->rank);
    text += (text.empty() ? "" : "; ") + rank_list(ranks) + " (pid " + std::to_string(pid) + " on " + host +
            ") died in " + where_text(*members.front());
  }
  return text;
}

std::string summarize_heartbeats(const std::vector<HeartbeatRecord>& records) {
  std::string out;
  for (const HeartbeatRecord& r : records) {
    out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r.rank) + " " + where_text(r);
    if (r.collective) out += " (in " + collective_text(*r.collective) + ")";
    if (r.finished) out += " (finished)";
  }
  return out.empty() ? "no heartbeats" : out;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace loom::ops
