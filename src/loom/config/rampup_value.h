#pragma once
// train.rampup_batch_size as a config value: a list of three integers [start, increment,
// samples], or Megatron's --rampup-batch-size text "256 128 50000000"; [] (or nothing) is off.
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/config/yaml_values.h"

namespace loom::config::detail {

template <>
struct Value<BatchRampup> {
  static constexpr const char* kExpected =
      "three integers [start, increment, samples] (e.g. [256, 128, 50000000]), Megatron's --rampup-batch-size "
      "text (\"256 128 50000000\"), or [] for none";
  static BatchRampup parse(const YAML::Node& node, const Origin& origin) {
    const std::vector<int64_t> numbers = node.IsScalar() ? numbers_in_text<int64_t>(node, origin, "")
                                                         : NumberListValue<int64_t>::parse(node, origin, kExpected);
    if (numbers.empty()) return {};
    if (numbers.size() != 3) wrong_type(origin, node, kExpected);
    return BatchRampup{numbers[0], numbers[1], numbers[2]};
  }
  static void emit(YAML::Emitter& out, const BatchRampup& value) {
    out << YAML::Flow << YAML::BeginSeq;
    if (value != BatchRampup{}) out << value.start << value.increment << value.samples;
    out << YAML::EndSeq;
  }
  static std::string show(const BatchRampup& value) {
    std::string text = "[";  // appended, not "[" + ...: gcc 12 gives a false -Wrestrict on the latter
    if (value != BatchRampup{}) {
      text.append(std::to_string(value.start)).append(", ").append(std::to_string(value.increment)).append(", ");
      text.append(std::to_string(value.samples));
    }
    return text.append("]");
  }
};

}  // namespace loom::config::detail
