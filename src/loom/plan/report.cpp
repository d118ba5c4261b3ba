#include "loom/plan/report.h"

#include <cstdio>
#include <string>
#include <sstream>

namespace loom::plan {

namespace {

std::string layers_of(const StageMemory& s) {
  std::ostringstream out;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    out << (i == 0 ? "" : " ") << "[" << s.chunks[i].first << "," << s.chunks[i].last << ")";
  }
  return out.str();
}

std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f ms", seconds * 1e3);
  return text;
}

}  // namespace

std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024 * 1024) {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  } else if (bytes >= 1024.0 * 1024) {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024));
  } else {
    std::snprintf(text, sizeof text, "%.0f KiB", bytes / 1024.0);
  }
  return text;
}

std::string memory_table(const MemoryPlan& plan) {
  const comm::MeshShape shape = plan.layout.shape;
  std::ostringstream o;
  o << "layout: tp " << shape.tp << (shape.cp > 1 ? " x cp " + std::to_string(shape.cp) : std::string()) << " x dp "
    << shape.dp << " x pp " << shape.pp << ", " << plan.layout.micro_batches
    << " micro-batches per step; memory of one rank per pipeline stage\n";
  o << "| stage | layers | params | parameters | gradients | master | moments | comm buffers | gather buffers | "
       "activations / mb | in flight | sets | activations | workspace | kv cache | total |\n";
  o << "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const StageMemory& s : plan.stages) {
    o << "| " << s.stage << " | " << layers_of(s) << " | " << s.parameter_count << " | "
      << format_bytes(s.state.parameters) << " | " << format_bytes(s.state.gradients) << " | "
      << format_bytes(s.state.master_weights) << " | " << format_bytes(s.state.optimizer_moments) << " | "
      << format_bytes(s.state.communication_buffers) << " | " << format_bytes(s.gather_buffers) << " | "
      << format_bytes(s.activations_per_micro_batch) << " | " << s.in_flight << " | " << s.activation_sets << " | "
      << format_bytes(s.activations)
      << " | " << format_bytes(s.workspace) << " | " << format_bytes(s.kv_cache) << " | " << format_bytes(s.total())
      << " |\n";
  }
  o << "peak per rank: " << format_bytes(plan.peak()) << "\n";
  for (const StageMemory& s : plan.stages) {
    if (s.state.host_parameters > 0) {
      o << "stage " << s.stage << ": parameter and gradient shards in host memory (parallel.offload_params) "
        << format_bytes(s.state.host_parameters) << " and " << format_bytes(s.state.host_gradients) << " per rank\n";
    }
    if (s.state.host_optimizer_moments == 0) continue;
    o << "stage " << s.stage << ": optimizer moments in host memory (optim.cpu_offload) "
      << format_bytes(s.state.host_optimizer_moments) << " per rank\n";
  }
  return o.str();
}

nlohmann::json memory_json(const MemoryPlan& plan) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageMemory& s : plan.stages) {
    stages.push_back({{"stage", s.stage},
                      {"layers", layers_of(s)},
                      {"parameter_count", s.parameter_count},
                      {"parameters", s.state.parameters},
                      {"gradients", s.state.gradients},
                      {"master_weights", s.state.master_weights},
                      {"optimizer_moments", s.state.optimizer_moments},
                      {"host_optimizer_moments", s.state.host_optimizer_moments},
                      {"host_parameters", s.state.host_parameters},
                      {"host_gradients", s.state.host_gradients},
                      {"communication_buffers", s.state.communication_buffers},
                      {"gather_buffers", s.gather_buffers},
                      {"activations_per_micro_batch", s.activations_per_micro_batch},
                      {"in_flight", s.in_flight},
                      {"activation_sets", s.activation_sets},
                      {"activations", s.activations},
                      {"workspace", s.workspace},
                      {"kv_cache", s.kv_cache},
                      {"total", s.total()}});
  }
  const comm::MeshShape shape = plan.layout.shape;
  return {{"tp", shape.tp}, {"cp", shape.cp}, {"dp", shape.dp}, {"pp", shape.pp},
          {"micro_batches", plan.layout.micro_batches},
          {"stages", stages}, {"peak", plan.peak()}};
}

std::string time_table(const TimeBreakdown& t) {
  std::ostringstream o;
  o << "| compute | casts | memory faults | bubble | core wait | tp comm | cp comm | ep comm | pp comm | "
       "dp comm (exposed) | host link | optimizer | overhead | step |\n"
    << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    << "| " << ms(t.compute) << " | " << ms(t.casts) << " | " << ms(t.memory) << " | " << ms(t.bubble) << " | "
    << ms(t.core_wait) << " | " << ms(t.tp_comm) << " | " << ms(t.cp_comm) << " | " << ms(t.ep_comm) << " | "
    << ms(t.pp_comm) << " | "
    << ms(t.dp_comm) << " | " << ms(t.host_link) << " | "
    << ms(t.optimizer) << " | " << ms(t.overhead) << " | " << ms(t.step) << " |\n";
  return o.str();
}

nlohmann::json time_json(const TimeBreakdown& t) {
  return {{"compute_s", t.compute},     {"casts_s", t.casts},         {"memory_s", t.memory},
          {"bubble_s", t.bubble},       {"core_wait_s", t.core_wait}, {"tp_comm_s", t.tp_comm},
          {"tp_comm_hidden_s", t.tp_comm_hidden},
          {"cp_comm_s", t.cp_comm},     {"ep_comm_s", t.ep_comm},     {"pp_comm_s", t.pp_comm},
          {"dp_comm_s", t.dp_comm},     {"host_link_s", t.host_link}, {"optimizer_s", t.optimizer},
          {"overhead_s", t.overhead},
          {"step_s", t.step}};
}

std::string search_table(const SearchResult& r, int top) {
  std::ostringstream o;
  o << r.enumerated << " layouts enumerated: " << r.refused << " refused by the layout rules, " << r.too_large
    << " do not fit the device's memory, " << r.ranked.size() << " ranked\n";
  if (r.ranked.empty() && !r.first_refusal.empty()) o << "the first refused: " << r.first_refusal << "\n";
  o << "| rank | layout | peak memory / rank | step | compute | casts + memory faults | bubble + core wait | tp | "
       "cp | ep | pp | dp | host link | optimizer |\n"
    << "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (int i = 0; i < top && i < static_cast<int>(r.ranked.size()); ++i) {
    const Candidate& c = r.ranked[static_cast<size_t>(i)];
    o << "| " << i + 1 << " | " << c.describe() << " | " << format_bytes(c.memory.peak()) << " | " << ms(c.time.step)
      << " | " << ms(c.time.compute) << " | " << ms(c.time.casts + c.time.memory) << " | "
      << ms(c.time.bubble + c.time.core_wait) << " | " << ms(c.time.tp_comm) << " | " << ms(c.time.cp_comm) << " | "
      << ms(c.time.ep_comm) << " | "
      << ms(c.time.pp_comm) << " | " << ms(c.time.dp_comm) << " | " << ms(c.time.host_link) << " | "
      << ms(c.time.optimizer) << " |\n";
  }
  if (!r.ranked.empty()) {
    o << "best: loom train CONFIG";
    for (const std::string& s : r.ranked.front().overrides()) o << " " << s;
    o << "\n";
  }
  return o.str();
}

nlohmann::json search_json(const SearchResult& r, int top) {
  nlohmann::json ranked = nlohmann::json::array();
  for (int i = 0; i < top && i < static_cast<int>(r.ranked.size()); ++i) {
    const Candidate& c = r.ranked[static_cast<size_t>(i)];
    ranked.push_back({{"layout", c.describe()}, {"overrides", c.overrides()}, {"memory", memory_json(c.memory)},
                      {"time", time_json(c.time)}});
  }
  return {{"enumerated", r.enumerated}, {"refused", r.refused},           {"too_large", r.too_large},
          {"ranked", ranked},           {"first_refusal", r.first_refusal}};
}

}  // namespace loom::plan
