#pragma once
// data.split as a config value: Megatron's --split text ("969,30,1", also "969/30/1" or
// "969 30 1"), or a list of up to three numbers [969, 30, 1]; one number is all train; "" or []
// is no split.
#include <sstream>
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
    if (node.IsNull()) return {};
    DataSplit split;
    if (node.IsSequence()) {
      for (size_t i = 0; i < node.size(); ++i)
        split.shares.push_back(
            Value<double>::parse(node[i], Origin{origin.where, origin.path + "[" + std::to_string(i) + "]"}));
      return split;
    }
    if (!node.IsScalar()) wrong_type(origin, node, kExpected);
    std::string text = node.Scalar();
    for (char& c : text)
      if (c == ',' || c == '/') c = ' ';
    std::istringstream words(text);
    for (std::string word; words >> word;) split.shares.push_back(Value<double>::parse(YAML::Node(word), origin));
    return split;
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
