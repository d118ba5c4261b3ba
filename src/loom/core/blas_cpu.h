#pragma once
// Picks OpenBLAS's kernel for the CPU we run on. OpenBLAS 0.3.21 (Debian 12) does not know
// newer CPUs (AMD Zen 4, ...) and falls back to its generic 'Prescott' kernel, 5x slower.
// OpenBLAS reads OPENBLAS_CORETYPE once, when the library is loaded, so the executable must
// set it and re-execute itself before any BLAS call.
#include <string>

namespace loom {

// The OpenBLAS core name for this CPU's features (SkylakeX for AVX-512, Haswell for AVX2, ...).
std::string detect_openblas_coretype();

// If OPENBLAS_CORETYPE is unset: sets it from the CPU's features and re-executes
// /proc/self/exe with the same arguments. Returns normally when nothing needed to change.
void ensure_openblas_coretype(char** argv);

}  // namespace loom
