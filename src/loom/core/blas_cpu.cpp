#include "loom/core/blas_cpu.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstdlib>

namespace loom {

namespace {
bool os_saves_avx512_state() {
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0xE6) == 0xE6;  // XMM, YMM, opmask, ZMM state enabled
}
bool os_saves_avx_state() {
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0x6) == 0x6;
}
}  // namespace

std::string detect_openblas_coretype() {
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return "";
  bool osxsave = ecx & (1u << 27);
  bool fma = ecx & (1u << 12);
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return "";
  bool avx2 = ebx & (1u << 5);
  bool avx512f = ebx & (1u << 16);
  bool avx512bw = ebx & (1u << 30);
  bool avx512vl = ebx & (1u << 31);
  if (osxsave && avx512f && avx512bw && avx512vl && os_saves_avx512_state()) return "SkylakeX";
  if (osxsave && avx2 && fma && os_saves_avx_state()) return "Haswell";
  return "";  // let OpenBLAS decide
}

void ensure_openblas_coretype(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  std::string core = detect_openblas_coretype();
  if (core.empty()) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  execv("/proc/self/exe", argv);
  // execv only returns on failure: carry on with OpenBLAS's own choice.
}

}  // namespace loom
