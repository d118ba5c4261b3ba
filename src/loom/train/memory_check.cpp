#include "loom/train/memory_check.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "loom/core/device.h"
#include "loom/plan/memory_plan.h"
#include "loom/plan/report.h"

namespace loom::train {

namespace {

// A field of /proc/self/status in bytes ("VmHWM:  1234 kB"), 0 when unreadable.
int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream in(line.substr(field.size() + 1));
    int64_t kib = 0;
    in >> kib;
    return kib * 1024;
  }
  return 0;
}

}  // namespace

MemoryCheck::MemoryCheck() : rss_start_(status_bytes("VmRSS")) {}

void MemoryCheck::start_step(Device device) {
  device_ = device;
  if (device.is_cuda()) allocator(device).reset_peak_bytes();
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";  // resets VmHWM to the current resident set
  clear.flush();
  peak_reset_ = clear.good();
}

MemoryCheck::Result MemoryCheck::measure(const config::RunConfig& run, comm::MeshShape shape, int pp_rank,
                                         bool threads) const {
  Result r;
  const plan::MemoryPlan plan = plan::plan_memory(run, shape);
  if (threads) {
    r.ranks = shape.tp * shape.cp * shape.dp * shape.pp;
    for (const plan::StageMemory& s : plan.stages) r.planned += s.total() * shape.tp * shape.cp * shape.dp;
  } else {
    r.planned = plan.stages.at(static_cast<size_t>(pp_rank)).total();
  }
  r.measured = status_bytes("VmHWM") - rss_start_;
  r.allocator_peak = host_allocator().peak_bytes();
  if (device_.is_cuda()) {
    r.device_now = allocator(device_).bytes_in_use();
    r.device_peak = allocator(device_).peak_bytes();
  }
  return r;
}

std::string MemoryCheck::report(const Result& r) const {
  std::ostringstream o;
  o << "memory: planned " << plan::format_bytes(static_cast<double>(r.planned)) << " for "
    << (r.ranks == 1 ? "this rank" : "the " + std::to_string(r.ranks) + " ranks of this process")
    << " (loom plan memory), measured " << plan::format_bytes(static_cast<double>(r.measured))
    << (peak_reset_ ? " (peak resident set in step 1" : " (peak resident set since start-up")
    << " less the resident set before the model was built; allocator peak "
    << plan::format_bytes(static_cast<double>(r.allocator_peak)) << ")";
  if (r.measured > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f", static_cast<double>(r.planned) / static_cast<double>(r.measured));
    o << ": planned / measured " << ratio;
  }
  if (device_.is_cuda()) {
    o << "; " << device_.name() << " committed: " << r.device_peak << " bytes ("
      << plan::format_bytes(static_cast<double>(r.device_peak)) << ") at the peak of step 1, " << r.device_now
      << " bytes after it";
  }
  return o.str();
}

}  // namespace loom::train
