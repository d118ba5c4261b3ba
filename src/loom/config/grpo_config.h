#pragma once
// The `grpo` section: GRPO's loss and learner settings (docs/grpo.md). Declared and checked in
// grpo_schema.cpp like every other section.
#include <array>
#include <cstdint>
#include <string_view>

#include "loom/config/enums.h"

namespace loom::config {

// grpo.importance_correction: how off-policy tokens are weighted by exp(old - generation
// log-probability): not at all, truncated at grpo.tis_cap, or zeroed outside
// [grpo.icepop_low, grpo.icepop_high].
enum class ImportanceCorrection : uint8_t { None, Tis, Icepop };
constexpr std::array<std::string_view, 3> names(ImportanceCorrection) { return {"none", "tis", "icepop"}; }

struct GrpoConfig {
  double clip_low = 0.2;    // the ratio's lower clip: 1 - clip_low
  double clip_high = 0.2;   // the ratio's upper clip: 1 + clip_high
  double dual_clip = 0.0;   // 0: off; else c > 1 bounds -A r by -A c for negative advantages
  double kl_coeff = 0.01;   // the k3 KL penalty's weight; 0: no reference policy
  ImportanceCorrection importance_correction = ImportanceCorrection::None;
  double tis_cap = 2.0;
  double icepop_low = 0.5, icepop_high = 5.0;
  bool normalize_std = true;    // advantages divided by the leave-one-out reward std
  double std_epsilon = 1e-6;
  int overlong_buffer = 0;         // DAPO's soft overlong penalty over the last N tokens; 0: off
  double overlong_penalty = 1.0;   // its largest penalty
  int overlong_max_tokens = 0;     // the response length limit it counts to (the generation limit)
  bool overlong_filter = false;    // truncated samples leave the loss
};

}  // namespace loom::config
