#include "loom/config/grpo_schema.h"

#include <string>

#include "loom/core/error.h"

namespace loom::config {

namespace detail {

namespace {
// grpo.dual_clip: 0 (off) or above 1 (a bound on the ratio for negative advantages).
Check<double> off_or_above_one() {
  return [](const double& value) -> std::optional<std::string> {
    if (value == 0.0 || value > 1.0) return std::nullopt;
    return std::string("must be 0 (off) or > 1 (NeMo RL's ratio_clip_c, typically 3)");
  };
}
}  // namespace

std::vector<Key<GrpoConfig>> grpo_keys() {
  return {
      field("clip_low", &GrpoConfig::clip_low, in_unit_interval()),
      field("clip_high", &GrpoConfig::clip_high, at_least(0.0)),
      field("dual_clip", &GrpoConfig::dual_clip, off_or_above_one()),
      field("kl_coeff", &GrpoConfig::kl_coeff, at_least(0.0)),
      field("importance_correction", &GrpoConfig::importance_correction),
      field("tis_cap", &GrpoConfig::tis_cap, greater_than(0)),
      field("icepop_low", &GrpoConfig::icepop_low, at_least(0.0)),
      field("icepop_high", &GrpoConfig::icepop_high, greater_than(0)),
      field("normalize_std", &GrpoConfig::normalize_std),
      field("std_epsilon", &GrpoConfig::std_epsilon, at_least(0.0)),
      field("overlong_buffer", &GrpoConfig::overlong_buffer, at_least(0)),
      field("overlong_penalty", &GrpoConfig::overlong_penalty, at_least(0.0)),
      field("overlong_max_tokens", &GrpoConfig::overlong_max_tokens, at_least(0)),
      field("overlong_filter", &GrpoConfig::overlong_filter),
  };
}

}  // namespace detail

void check_grpo(const RunConfig& config) {
  using detail::format_double;
  const GrpoConfig& g = config.grpo;
  LOOM_CHECK(g.icepop_low < g.icepop_high, "grpo.icepop_low = " + format_double(g.icepop_low) +
                                               " is invalid: must be below grpo.icepop_high = " +
                                               format_double(g.icepop_high));
  LOOM_CHECK(g.overlong_buffer == 0 || (g.overlong_max_tokens > 0 && g.overlong_buffer <= g.overlong_max_tokens),
             "grpo.overlong_buffer = " + std::to_string(g.overlong_buffer) +
                 " needs grpo.overlong_max_tokens (the generation's response limit) at least as large; it is " +
                 std::to_string(g.overlong_max_tokens));
}

}  // namespace loom::config
