#pragma once
// Counter-based Philox4x32-10 generator (Salmon et al., SC'11). A value depends only on
// (key, counter), so any shard can draw exactly its slice of a global random tensor.
#include <array>
#include <cstdint>
#include <string_view>

namespace loom {

using PhiloxBlock = std::array<uint32_t, 4>;

PhiloxBlock philox4x32(uint64_t key, uint64_t counter_lo, uint64_t counter_hi = 0);

// Stable 64-bit FNV-1a hash of a name (parameter names key their initialisation streams).
uint64_t stable_hash(std::string_view text);

// Key for (seed, name): mixes the run seed with the parameter's global name.
uint64_t philox_key(uint64_t seed, std::string_view name);

// Uniform in [0, 1) from 24 bits of the first word for `index`.
float philox_uniform(uint64_t key, uint64_t index, uint64_t stream = 0);
// Standard normal (Box-Muller on two words) for `index`.
float philox_normal(uint64_t key, uint64_t index, uint64_t stream = 0);

}  // namespace loom
