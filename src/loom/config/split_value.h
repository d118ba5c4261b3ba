#pragma once
// data.split as a config value: Megatron's --split text ("969,30,1", also "969/30/1" or
// "969 30 1"), or a list of up to three numbers [969, 30, 1]; one number is all train; "" or []
// is no split.
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/config/yaml_values.h"

namespace loom::config::detail {

template <>
struct Value<DataSplit> {
  static constexpr const char* kExpected =
      "up to three shares (train, validation, test) as Megatron's --split text \"969,30,1\" or a list [969, 30, 1], "
      "or \"\" for none";
  static DataSplit parse(const YAML::Node& node, const Origin& origin) {
    if (node.IsScalar()) return {numbers_in_text<double>(node, origin, ",/")};
    return {NumberListValue<double>::parse(node, origin, kExpected)};
  }
  static void emit(YAML::Emitter& out, const DataSplit& value) { out << show(value); }
  static std::string show(const DataSplit& value) {
    std::string text;
    for (size_t i = 0; i < value.shares.size(); ++i) {
      text.append(i == 0 ? "" : ",").append(format_double(value.shares[i]));
    }
    return text;
  }
};

}  // namespace loom::config::detail
