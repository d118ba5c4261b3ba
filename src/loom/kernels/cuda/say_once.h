#pragma once
// A line on stderr ("loom: <line>") the first time the process says it: why a kernel path was not
// taken (loom's attention kernels in place of cuDNN's, grouped GEMMs run one by one), once per reason.
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

namespace loom::kernels::cuda {

inline void say_once(const std::string& line) {
  static std::mutex mutex;
  static auto* said = new std::set<std::string>();  // never destroyed: said from any thread until exit
  std::lock_guard<std::mutex> lock(mutex);
  if (said->insert(line).second) std::fprintf(stderr, "loom: %s\n", line.c_str());
}

}  // namespace loom::kernels::cuda
