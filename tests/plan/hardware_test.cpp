// Hardware files: what they say, and clear errors naming the file and key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/plan/hardware.h"
#include "support/test_paths.h"

namespace loom::plan {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_hardware(yaml, "hw.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Hardware, ReadsDeviceAndLinks) {
  const Hardware hw = parse_hardware(R"(
device: {name: H100, peak_tflops: 989, gemm_efficiency: 0.5, memory_gib: 80, memory_bandwidth_gbs: 3350}
ranks_per_node: 8
links: {node_bandwidth_gbps: 3600, node_latency_us: 2, site_bandwidth_gbps: 400, site_latency_us: 5}
comm_overlap: 0.5
)",
                                     "hw.yaml");
  EXPECT_EQ(hw.name, "H100");
  EXPECT_DOUBLE_EQ(hw.peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(hw.flops_per_rank(64), 989e12 * 0.5);  // not shared: every rank its own device
  EXPECT_DOUBLE_EQ(hw.memory_bytes, 80.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(hw.ranks_per_node, 8);
  EXPECT_DOUBLE_EQ(hw.link(comm::LinkClass::SameNode).bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(hw.link(comm::LinkClass::SameSite).latency, 5e-6);
  EXPECT_DOUBLE_EQ(hw.comm_overlap, 0.5);
  EXPECT_DOUBLE_EQ(hw.fp8_flops_per_rank(1), hw.flops_per_rank(1));  // no FP8 rate: the same
  const Hardware fp8 = parse_hardware(R"(
device: {peak_tflops: 989, fp8_peak_tflops: 1979, gemm_efficiency: 0.8, fp8_gemm_efficiency: 0.6, memory_gib: 80}
)",
                                      "hw.yaml");
  EXPECT_DOUBLE_EQ(fp8.fp8_flops_per_rank(1), 1979e12 * 0.6);
  // A GEMM's output written after its products, at the memory bandwidth; by default hidden.
  EXPECT_FALSE(hw.gemm_writes_output);
  EXPECT_EQ(hw.gemm_output_seconds(1e9), 0.0);
  const Hardware gpu = parse_hardware(
      "device: {peak_tflops: 989, memory_gib: 141, memory_bandwidth_gbs: 4000, gemm_writes_output: true}\n", "hw.yaml");
  EXPECT_TRUE(gpu.gemm_writes_output);
  EXPECT_DOUBLE_EQ(gpu.gemm_output_seconds(8e9), 2e-3);
  // An offloaded optimizer's host: estimates by default, or the file's.
  EXPECT_DOUBLE_EQ(gpu.host_link_bandwidth, 40e9);
  EXPECT_DOUBLE_EQ(gpu.host_memory_bandwidth, 30e9);
  const Hardware host = parse_hardware(
      "device: {peak_tflops: 989, memory_gib: 80}\nhost: {link_gbs: 50, memory_bandwidth_gbs: 120}\n", "hw.yaml");
  EXPECT_DOUBLE_EQ(host.host_link_bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(host.host_memory_bandwidth, 120e9);
}

TEST(Hardware, ShippedFilesParse) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(loom::test_paths::source_dir() + "/configs/hardware")) {
    SCOPED_TRACE(entry.path().string());
    const Hardware hw = load_hardware(entry.path().string());
    EXPECT_GT(hw.peak_flops, 0.0);
    ++count;
  }
  EXPECT_GE(count, 2);
}

TEST(Hardware, ASharedHostDividesItsCores) {
  const Hardware hw =
      parse_hardware("device: {peak_tflops: 0.04, memory_gib: 16, shared: true, cores: 2}\n", "cpu.yaml");
  EXPECT_DOUBLE_EQ(hw.flops_per_rank(1), 0.04e12);
  EXPECT_DOUBLE_EQ(hw.flops_per_rank(2), 0.04e12);
  EXPECT_DOUBLE_EQ(hw.flops_per_rank(4), 0.02e12);
}

TEST(Hardware, ThreadsSpeedARankUpInProportionUpToTheProcessors) {
  const Hardware hw = parse_hardware(
      "device: {peak_tflops: 1, memory_gib: 1, shared: true, cores: 3.5, processors: 4, gemm_thread_speedup: 3.4,"
      " memory_thread_speedup: 2.2}\n",
      "cpu.yaml");
  EXPECT_EQ(hw.processors, 4);
  EXPECT_DOUBLE_EQ(hw.gemm_speedup(1), 1.0);
  EXPECT_DOUBLE_EQ(hw.gemm_speedup(3), 1.0 + 2.4 * 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(hw.gemm_speedup(4), 3.4);
  EXPECT_DOUBLE_EQ(hw.gemm_speedup(64), 3.4);
  EXPECT_DOUBLE_EQ(hw.memory_speedup(2), 1.4);
  const Hardware device = parse_hardware(
      "device: {peak_tflops: 1, memory_gib: 1, processors: 4, gemm_thread_speedup: 3.4}\n", "gpu.yaml");
  EXPECT_DOUBLE_EQ(device.gemm_speedup(4), 1.0);  // not a shared host: the device's own rate
  const Hardware defaults = parse_hardware("device: {peak_tflops: 1, memory_gib: 1, shared: true}\n", "cpu.yaml");
  EXPECT_DOUBLE_EQ(defaults.gemm_speedup(8), 1.0);
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1, processors: 0}")
                .find("'device.processors' must be in [1, "),
            std::string::npos)
      << error_of("device: {peak_tflops: 1, memory_gib: 1, processors: 0}");
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1, memory_thread_speedup: 0}")
                .find("'device.memory_thread_speedup' must be in [0.01, "),
            std::string::npos);
}

TEST(Hardware, CastAndMemoryRatesDefaultToTheBandwidthOrToFree) {
  const Hardware plain = parse_hardware("device: {peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbs: 30}\n", "hw.yaml");
  EXPECT_DOUBLE_EQ(plain.activation_rate_per_rank(1), 10e9);  // three passes at the bandwidth
  EXPECT_FALSE(plain.costs_casts());                          // fused into the kernels
  EXPECT_DOUBLE_EQ(plain.cast_seconds(1e9, true, 1), 0.0);
  EXPECT_DOUBLE_EQ(plain.fresh_memory_seconds(1e9, 1), 0.0);
  EXPECT_DOUBLE_EQ(plain.scan_flops_per_rank(1), 0.5e12);  // the Mamba-2 scan in double: half the GEMM rate
  const Hardware measured = parse_hardware(R"(
device: {peak_tflops: 1, memory_gib: 1, shared: true, cores: 2, activation_gbs: 4, bf16_cast_gelems: 2,
         fp8_cast_gelems: 0.5, fresh_memory_gbs: 8, scan_tflops: 0.01}
)",
                                           "hw.yaml");
  EXPECT_DOUBLE_EQ(measured.activation_rate_per_rank(1), 4e9);
  EXPECT_DOUBLE_EQ(measured.cast_seconds(2e9, false, 1), 1.0);
  EXPECT_DOUBLE_EQ(measured.cast_seconds(0.25e9, true, 4), 1.0);  // four ranks on two cores: 0.25 G/s each
  EXPECT_DOUBLE_EQ(measured.fresh_memory_seconds(8e9, 1), 1.0);
  EXPECT_DOUBLE_EQ(measured.scan_flops_per_rank(1), 0.01e12);
  EXPECT_DOUBLE_EQ(measured.scan_flops_per_rank(4), 0.005e12);  // four ranks on two cores
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1, scan_tflops: -2}")
                .find("'device.scan_tflops' must be in [0, 1e+06] (got -2)"),
            std::string::npos)
      << error_of("device: {peak_tflops: 1, memory_gib: 1, scan_tflops: -2}");
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1, fresh_memory_gbs: -1}")
                .find("'device.fresh_memory_gbs' must be in [0, 1e+09] (got -1)"),
            std::string::npos)
      << error_of("device: {peak_tflops: 1, memory_gib: 1, fresh_memory_gbs: -1}");
}

TEST(Hardware, BadFilesNameTheFileTheKeyAndWhatIsValid) {
  EXPECT_NE(error_of("device: {peak_tflop: 1, memory_gib: 1}").find(
                "hw.yaml: hardware key 'device.peak_tflop' is not known; valid keys of device: name, peak_tflops"),
            std::string::npos)
      << error_of("device: {peak_tflop: 1, memory_gib: 1}");
  EXPECT_NE(error_of("device: {peak_tflop: 1, memory_gib: 1}").find("did you mean 'peak_tflops'?"), std::string::npos);
  EXPECT_NE(error_of("device: {memory_gib: 1}").find("'device.peak_tflops' is missing"), std::string::npos);
  EXPECT_NE(error_of("device: {peak_tflops: fast, memory_gib: 1}").find("'device.peak_tflops' must be a number (got 'fast')"),
            std::string::npos);
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1, gemm_efficiency: 1.5}")
                .find("'device.gemm_efficiency' must be in [0.001, 1] (got 1.5)"),
            std::string::npos);
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1, gemm_writes_output: often}").find("device.gemm_writes_output"),
            std::string::npos)
      << error_of("device: {peak_tflops: 1, memory_gib: 1, gemm_writes_output: often}");
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1}\nlinks: {nvlink_gbps: 1}").find("links.nvlink_gbps"),
            std::string::npos);
  EXPECT_NE(error_of("devices: {}").find("'devices' is not known"), std::string::npos);
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1}\nhost: {pcie_gbs: 25}")
                .find("'host.pcie_gbs' is not known; valid keys of host: link_gbs, memory_bandwidth_gbs"),
            std::string::npos);
  EXPECT_NE(error_of("device: {peak_tflops: 1, memory_gib: 1}\nhost: {link_gbs: 0}")
                .find("'host.link_gbs' must be in [0.001, 1e+09] (got 0)"),
            std::string::npos)
      << error_of("device: {peak_tflops: 1, memory_gib: 1}\nhost: {link_gbs: 0}");
  EXPECT_NE(error_of("device: [1, 2").find("hw.yaml: not valid YAML"), std::string::npos);
  EXPECT_NE(error_of("ranks_per_node: 8").find("'device' is missing"), std::string::npos);
  try {
    load_hardware("/nonexistent/hw.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read hardware file /nonexistent/hw.yaml"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom::plan
