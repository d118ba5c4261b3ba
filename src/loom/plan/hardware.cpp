#include "loom/plan/hardware.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include "loom/config/suggestion.h"
#include "loom/core/error.h"

namespace loom::plan {

namespace {

struct Reader {
  const std::string& source;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source + ": hardware key '" + key + "' " + what);
  }
  // Every key of `node` must be one of `known`.
  void only(const YAML::Node& node, const std::string& section, const std::vector<std::string>& known) const {
    if (!node.IsMap()) fail(section.empty() ? "(top level)" : section, "must be a mapping of keys to values");
    for (const auto& item : node) {
      const std::string key = item.first.as<std::string>();
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string valid;
      for (const std::string& k : known) valid += (valid.empty() ? "" : ", ") + k;
      const std::string full = section.empty() ? key : section + "." + key;
      fail(full, "is not known; valid keys" + std::string(section.empty() ? "" : " of " + section) + ": " + valid +
                     config::suggestion(key, known));
    }
  }
  double number(const YAML::Node& node, const std::string& key, double fallback, double lo, double hi) const {
    if (!node) return fallback;
    double v = 0.0;
    try {
      v = node.as<double>();
    } catch (const YAML::Exception&) {
      fail(key, "must be a number (got '" + node.as<std::string>("?") + "')");
    }
    if (!(v >= lo && v <= hi)) {
      std::ostringstream range;
      range << "must be in [" << lo << ", " << hi << "] (got " << v << ")";
      fail(key, range.str());
    }
    return v;
  }
  bool boolean(const YAML::Node& node, const std::string& key, bool fallback) const {
    if (!node) return fallback;
    try {
      return node.as<bool>();
    } catch (const YAML::Exception&) {
      fail(key, "must be true or false (got '" + node.as<std::string>("?") + "')");
    }
  }
};

void read_links(const Reader& r, const YAML::Node& links, Hardware& hw) {
  const std::vector<std::string> classes = {"node", "site", "cross_site"};
  std::vector<std::string> known;
  for (const std::string& c : classes) {
    known.push_back(c + "_bandwidth_gbps");
    known.push_back(c + "_latency_us");
  }
  if (!links) return;
  r.only(links, "links", known);
  for (size_t c = 0; c < classes.size(); ++c) {
    const std::string bw = classes[c] + "_bandwidth_gbps", lat = classes[c] + "_latency_us";
    hw.links[c].bandwidth = r.number(links[bw], "links." + bw, hw.links[c].bandwidth * 8 / 1e9, 1e-6, 1e9) * 1e9 / 8;
    hw.links[c].latency = r.number(links[lat], "links." + lat, hw.links[c].latency * 1e6, 0.0, 1e9) / 1e6;
  }
}

}  // namespace

namespace {
double core_share(const Hardware& hw, int ranks) {
  return hw.shared ? std::min(1.0, hw.cores / std::max(1, ranks)) : 1.0;
}
}  // namespace

double Hardware::flops_per_rank(int ranks) const { return peak_flops * gemm_efficiency * core_share(*this, ranks); }
double Hardware::fp8_flops_per_rank(int ranks) const {
  if (fp8_peak_flops <= 0.0) return flops_per_rank(ranks);
  return fp8_peak_flops * (fp8_gemm_efficiency > 0.0 ? fp8_gemm_efficiency : gemm_efficiency) * core_share(*this, ranks);
}
double Hardware::attention_flops_per_rank(int ranks) const {
  return peak_flops * (attention_efficiency > 0.0 ? attention_efficiency : gemm_efficiency) * core_share(*this, ranks);
}
double Hardware::scan_flops_per_rank(int ranks) const {
  return (scan_flops > 0.0 ? scan_flops : peak_flops * gemm_efficiency / 2.0) * core_share(*this, ranks);
}
double Hardware::bandwidth_per_rank(int ranks) const { return memory_bandwidth * core_share(*this, ranks); }
double Hardware::activation_rate_per_rank(int ranks) const {
  return (activation_bandwidth > 0.0 ? activation_bandwidth : memory_bandwidth / 3.0) * core_share(*this, ranks);
}
double Hardware::thread_speedup(double at_processors, int threads) const {
  if (!shared || threads <= 1 || processors <= 1) return 1.0;
  const double share = static_cast<double>(std::min(threads, processors) - 1) / (processors - 1);
  return 1.0 + (at_processors - 1.0) * share;
}
double Hardware::cast_seconds(double elements, bool fp8, int ranks) const {
  if (!costs_casts()) return 0.0;
  const double rate = fp8 && fp8_cast_rate > 0.0 ? fp8_cast_rate : bf16_cast_rate > 0.0 ? bf16_cast_rate : fp8_cast_rate;
  return elements / (rate * core_share(*this, ranks));
}
double Hardware::fresh_memory_seconds(double bytes, int ranks) const {
  return fresh_memory_bandwidth > 0.0 ? bytes / (fresh_memory_bandwidth * core_share(*this, ranks)) : 0.0;
}

Hardware parse_hardware(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw Error(source + ": not valid YAML: " + e.what());
  }
  const Reader r{source};
  r.only(root, "", {"device", "ranks_per_node", "links", "host", "step_overhead_ms", "comm_overlap"});
  const YAML::Node device = root["device"];
  if (!device) r.fail("device", "is missing: a hardware file needs device.peak_tflops and device.memory_gib");
  r.only(device, "device",
         {"name", "peak_tflops", "fp8_peak_tflops", "gemm_efficiency", "fp8_gemm_efficiency", "gemm_half_rows",
          "gemm_writes_output", "attention_efficiency", "scan_tflops",
          "memory_gib", "memory_bandwidth_gbs", "shared", "cores", "processors", "gemm_thread_speedup",
          "memory_thread_speedup",
          "activation_bytes", "fused_attention", "activation_gbs", "bf16_cast_gelems", "fp8_cast_gelems", "fresh_memory_gbs"});
  Hardware hw;
  hw.source = source;
  hw.name = device["name"] ? device["name"].as<std::string>() : source;
  if (!device["peak_tflops"]) r.fail("device.peak_tflops", "is missing (dense FLOP/s of one device, in TFLOP/s)");
  if (!device["memory_gib"]) r.fail("device.memory_gib", "is missing (one device's memory, in GiB)");
  hw.peak_flops = r.number(device["peak_tflops"], "device.peak_tflops", 0, 1e-6, 1e6) * 1e12;
  hw.fp8_peak_flops = r.number(device["fp8_peak_tflops"], "device.fp8_peak_tflops", 0.0, 0.0, 1e6) * 1e12;
  hw.gemm_efficiency = r.number(device["gemm_efficiency"], "device.gemm_efficiency", 1.0, 1e-3, 1.0);
  hw.fp8_gemm_efficiency = r.number(device["fp8_gemm_efficiency"], "device.fp8_gemm_efficiency", hw.gemm_efficiency,
                                    1e-3, 1.0);
  hw.attention_efficiency = r.number(device["attention_efficiency"], "device.attention_efficiency",
                                     hw.gemm_efficiency, 1e-3, 1.0);
  hw.scan_flops = r.number(device["scan_tflops"], "device.scan_tflops", 0.0, 0.0, 1e6) * 1e12;
  hw.gemm_half_rows = r.number(device["gemm_half_rows"], "device.gemm_half_rows", 0.0, 0.0, 1e9);
  hw.gemm_writes_output = r.boolean(device["gemm_writes_output"], "device.gemm_writes_output", false);
  hw.memory_bytes = r.number(device["memory_gib"], "device.memory_gib", 0, 1e-6, 1e9) * 1024.0 * 1024.0 * 1024.0;
  hw.memory_bandwidth = r.number(device["memory_bandwidth_gbs"], "device.memory_bandwidth_gbs", 1000, 1e-3, 1e9) * 1e9;
  hw.shared = r.boolean(device["shared"], "device.shared", false);
  hw.cores = r.number(device["cores"], "device.cores", 1, 0.01, 1 << 20);
  hw.processors = static_cast<int>(r.number(device["processors"], "device.processors", 1, 1, 1 << 20));
  hw.gemm_thread_speedup = r.number(device["gemm_thread_speedup"], "device.gemm_thread_speedup", 1, 0.01, 1 << 20);
  hw.memory_thread_speedup =
      r.number(device["memory_thread_speedup"], "device.memory_thread_speedup", 1, 0.01, 1 << 20);
  hw.activation_bytes = static_cast<int>(r.number(device["activation_bytes"], "device.activation_bytes", 4, 2, 4));
  if (hw.activation_bytes == 3) r.fail("device.activation_bytes", "must be 2 or 4 (got 3)");
  hw.fused_attention = r.boolean(device["fused_attention"], "device.fused_attention", true);
  hw.activation_bandwidth = r.number(device["activation_gbs"], "device.activation_gbs", 0.0, 0.0, 1e9) * 1e9;
  hw.bf16_cast_rate = r.number(device["bf16_cast_gelems"], "device.bf16_cast_gelems", 0.0, 0.0, 1e9) * 1e9;
  hw.fp8_cast_rate = r.number(device["fp8_cast_gelems"], "device.fp8_cast_gelems", 0.0, 0.0, 1e9) * 1e9;
  hw.fresh_memory_bandwidth = r.number(device["fresh_memory_gbs"], "device.fresh_memory_gbs", 0.0, 0.0, 1e9) * 1e9;
  hw.ranks_per_node = static_cast<int>(r.number(root["ranks_per_node"], "ranks_per_node", 1, 1, 1 << 20));
  // The defaults of topology.* (config/run_config.h).
  hw.links[0] = {3600e9 / 8, 1e-6};
  hw.links[1] = {400e9 / 8, 5e-6};
  hw.links[2] = {100e9 / 8, 10500e-6};
  read_links(r, root["links"], hw);
  if (const YAML::Node host = root["host"]) {
    r.only(host, "host", {"link_gbs", "memory_bandwidth_gbs"});
    hw.host_link_bandwidth = r.number(host["link_gbs"], "host.link_gbs", hw.host_link_bandwidth / 1e9, 1e-3, 1e9) * 1e9;
    hw.host_memory_bandwidth =
        r.number(host["memory_bandwidth_gbs"], "host.memory_bandwidth_gbs", hw.host_memory_bandwidth / 1e9, 1e-3, 1e9) *
        1e9;
  }
  hw.step_overhead = r.number(root["step_overhead_ms"], "step_overhead_ms", 0.0, 0.0, 1e9) / 1e3;
  hw.comm_overlap = r.number(root["comm_overlap"], "comm_overlap", 0.0, 0.0, 1.0);
  return hw;
}

Hardware load_hardware(const std::string& path) {
  std::ifstream in(path);
  LOOM_CHECK(in.good(), "cannot read hardware file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_hardware(text.str(), path);
}

}  // namespace loom::plan
