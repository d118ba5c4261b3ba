#pragma once
// How config values are read from YAML, written back and shown in messages: one `Value<T>` per
// field type (int, auto counts, unsigned, double, bool, string, the enums of config/enums.h),
// and the message helpers they share. Used by the schema in run_config.cpp.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "loom/config/enums.h"
#include "loom/config/run_config.h"
#include "loom/config/suggestion.h"
#include "loom/core/error.h"

namespace loom::config::detail {

// ---------------------------------------------------------------------------------------------
// Helpers for messages: quoting, lists, "did you mean".

inline std::string in_quotes(std::string_view text) {
  std::string out;  // appended, not "'" + ...: gcc 12 gives a false -Wrestrict on the latter
  out.reserve(text.size() + 2);
  return out.append("'").append(text).append("'");
}

inline std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// "file.yaml:3:5" from a yaml-cpp mark (0-based), or just the source when the mark is unknown.
inline std::string at(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// The 1-based number of the first line whose leading whitespace holds a tab, or 0.
inline int first_tab_indented_line(const std::string& text) {
  int line = 1;
  bool leading = true;
  for (char c : text) {
    if (c == '\n') {
      ++line;
      leading = true;
    } else if (leading && c == '\t') {
      return line;
    } else if (c != ' ') {
      leading = false;
    }
  }
  return 0;
}

// Shortest text that parses back to exactly the same double.
inline std::string format_double(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// ---------------------------------------------------------------------------------------------
// Value types: how a YAML node becomes a field, how a field is written back, how it is shown
// in messages. A new field type (e.g. `dp: auto`) is one more specialisation.

// Where a value came from, for messages: "file.yaml:4:10" or "override 'train.steps=ten'".
struct Origin {
  std::string where;
  std::string path;  // "train.steps", "model.block_configs[2].ffn_size"
};

[[noreturn]] inline void wrong_type(const Origin& origin, const YAML::Node& node, const std::string& expected) {
  std::string shown;
  if (node.IsScalar()) shown = in_quotes(node.Scalar());
  else if (node.IsSequence()) shown = "a list";
  else if (node.IsMap()) shown = "a map";
  else shown = "nothing";
  throw Error(origin.where + ": " + origin.path + " = " + shown + " is not " + expected);
}

template <class T>
struct Value;

// A decimal integer (a leading '+' allowed) that fits T, whose bit width `bits` names.
template <class T>
T parse_integer(const YAML::Node& node, const Origin& origin, const char* expected, const char* bits) {
  if (!node.IsScalar()) wrong_type(origin, node, expected);
  std::string_view text = node.Scalar();
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  long long value = 0;
  auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec == std::errc::result_out_of_range ||
      (result.ec == std::errc() && result.ptr == text.data() + text.size() &&
       (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max())))
    throw Error(origin.where + ": " + origin.path + " = " + in_quotes(node.Scalar()) + " does not fit a " + bits +
                " integer");
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || text.empty())
    wrong_type(origin, node, expected);
  return static_cast<T>(value);
}

template <>
struct Value<int> {
  static constexpr const char* kExpected = "an integer (e.g. 8)";
  static int parse(const YAML::Node& node, const Origin& origin) {
    return parse_integer<int>(node, origin, kExpected, "32-bit");
  }
  static void emit(YAML::Emitter& out, int value) { out << std::to_string(value); }
  static std::string show(int value) { return std::to_string(value); }
};

template <>
struct Value<int64_t> {
  static constexpr const char* kExpected = "an integer (e.g. 1000000)";
  static int64_t parse(const YAML::Node& node, const Origin& origin) {
    return parse_integer<int64_t>(node, origin, kExpected, "64-bit");
  }
  static void emit(YAML::Emitter& out, int64_t value) { out << std::to_string(value); }
  static std::string show(int64_t value) { return std::to_string(value); }
};

template <>
struct Value<AutoCount> {
  static constexpr const char* kExpected = "a positive integer or auto";
  static AutoCount parse(const YAML::Node& node, const Origin& origin) {
    if (node.IsScalar() && node.Scalar() == "auto") return AutoCount{0};
    int value = -1;
    try {
      value = Value<int>::parse(node, origin);
    } catch (const Error&) {
      wrong_type(origin, node, kExpected);
    }
    if (value < 0) wrong_type(origin, node, kExpected);
    return AutoCount{value};
  }
  static void emit(YAML::Emitter& out, AutoCount value) { out << show(value); }
  static std::string show(AutoCount value) { return value.is_auto() ? "auto" : std::to_string(value.value); }
};

template <>
struct Value<uint64_t> {
  static constexpr const char* kExpected = "a non-negative integer (e.g. 1234)";
  static uint64_t parse(const YAML::Node& node, const Origin& origin) {
    if (!node.IsScalar()) wrong_type(origin, node, kExpected);
    std::string_view text = node.Scalar();
    if (!text.empty() && text.front() == '+') text.remove_prefix(1);
    uint64_t value = 0;
    auto result = std::from_chars(text.data(), text.data() + text.size(), value);
    if (result.ec == std::errc::result_out_of_range)
      throw Error(origin.where + ": " + origin.path + " = " + in_quotes(node.Scalar()) +
                  " does not fit a 64-bit unsigned integer");
    if (result.ec != std::errc() || result.ptr != text.data() + text.size() || text.empty())
      wrong_type(origin, node, kExpected);
    return value;
  }
  static void emit(YAML::Emitter& out, uint64_t value) { out << std::to_string(value); }
  static std::string show(uint64_t value) { return std::to_string(value); }
};

template <>
struct Value<double> {
  static constexpr const char* kExpected = "a finite number (e.g. 3e-4)";
  static double parse(const YAML::Node& node, const Origin& origin) {
    if (!node.IsScalar()) wrong_type(origin, node, kExpected);
    std::string_view text = node.Scalar();
    if (!text.empty() && text.front() == '+') text.remove_prefix(1);
    double value = 0;
    auto result = std::from_chars(text.data(), text.data() + text.size(), value);
    if (result.ec != std::errc() || result.ptr != text.data() + text.size() || text.empty() ||
        !std::isfinite(value))
      wrong_type(origin, node, kExpected);
    return value;
  }
  static void emit(YAML::Emitter& out, double value) { out << format_double(value); }
  static std::string show(double value) { return format_double(value); }
};

template <>
struct Value<bool> {
  static constexpr const char* kExpected = "a bool (true or false)";
  static bool parse(const YAML::Node& node, const Origin& origin) {
    if (!node.IsScalar()) wrong_type(origin, node, kExpected);
    std::string text = node.Scalar();
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    // The YAML 1.1 spellings, which is what yaml-cpp users expect.
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
    wrong_type(origin, node, kExpected);
  }
  static void emit(YAML::Emitter& out, bool value) { out << (value ? "true" : "false"); }
  static std::string show(bool value) { return value ? "true" : "false"; }
};

template <>
struct Value<std::string> {
  static constexpr const char* kExpected = "a string";
  static std::string parse(const YAML::Node& node, const Origin& origin) {
    if (node.IsNull()) return "";  // `val_prefix:` with nothing after it means empty
    if (!node.IsScalar()) wrong_type(origin, node, kExpected);
    return node.Scalar();
  }
  // Always quoted: a path like "~" or "null" must not come back as YAML null.
  static void emit(YAML::Emitter& out, const std::string& value) { out << YAML::DoubleQuoted << value; }
  static std::string show(const std::string& value) { return in_quotes(value); }
};

// A list of strings: a YAML list, or one string for a list of one.
template <>
struct Value<std::vector<std::string>> {
  static constexpr const char* kExpected = "a list of strings (e.g. [a.jsonl, b.jsonl])";
  static std::vector<std::string> parse(const YAML::Node& node, const Origin& origin) {
    if (node.IsNull()) return {};
    if (node.IsScalar()) return {node.Scalar()};
    if (!node.IsSequence()) wrong_type(origin, node, kExpected);
    std::vector<std::string> items;
    for (size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) wrong_type(Origin{origin.where, origin.path + "[" + std::to_string(i) + "]"}, node[i], "a string");
      items.push_back(node[i].Scalar());
    }
    return items;
  }
  static void emit(YAML::Emitter& out, const std::vector<std::string>& items) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const std::string& item : items) out << YAML::DoubleQuoted << item;
    out << YAML::EndSeq;
  }
  static std::string show(const std::vector<std::string>& items) {
    std::string text = "[";
    text += join(items);
    return text + "]";
  }
};

// A list of numbers of type T: a YAML list, or one number for a list of one.
template <class T>
struct NumberListValue {
  static std::vector<T> parse(const YAML::Node& node, const Origin& origin, const char* expected) {
    if (node.IsNull()) return {};
    if (node.IsScalar()) return {Value<T>::parse(node, origin)};
    if (!node.IsSequence()) wrong_type(origin, node, expected);
    std::vector<T> items;
    for (size_t i = 0; i < node.size(); ++i)
      items.push_back(Value<T>::parse(node[i], Origin{origin.where, origin.path + "[" + std::to_string(i) + "]"}));
    return items;
  }
  static void emit(YAML::Emitter& out, const std::vector<T>& items) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const T& item : items) out << Value<T>::show(item);
    out << YAML::EndSeq;
  }
  static std::string show(const std::vector<T>& items) {
    std::string text = "[";
    for (size_t i = 0; i < items.size(); ++i) text += (i == 0 ? "" : ", ") + Value<T>::show(items[i]);
    return text + "]";
  }
};

// Numbers written as Megatron's command-line text: one scalar of numbers separated by spaces or
// any of `separators` ("256 128 50000000", "969,30,1"), each parsed as Value<T> (a bad one named).
template <class T>
std::vector<T> numbers_in_text(const YAML::Node& node, const Origin& origin, std::string_view separators) {
  std::string text = node.Scalar();
  for (char& c : text)
    if (separators.find(c) != std::string_view::npos) c = ' ';
  std::istringstream words(text);
  std::vector<T> numbers;
  for (std::string word; words >> word;) numbers.push_back(Value<T>::parse(YAML::Node(word), origin));
  return numbers;
}

template <>
struct Value<std::vector<int>> : NumberListValue<int> {
  static constexpr const char* kExpected = "a list of integers (e.g. [0, 4])";
  static std::vector<int> parse(const YAML::Node& node, const Origin& origin) {
    return NumberListValue<int>::parse(node, origin, kExpected);
  }
};

template <>
struct Value<std::vector<double>> : NumberListValue<double> {
  static constexpr const char* kExpected = "a list of numbers (e.g. [0.7, 0.3])";
  static std::vector<double> parse(const YAML::Node& node, const Origin& origin) {
    return NumberListValue<double>::parse(node, origin, kExpected);
  }
};

// A name outside an enum's table, found while parsing: parse_config reports it as it reports a
// failed check (after the source's name), with the message a one_of check gives.
struct UnknownName : Error {
  using Error::Error;
};

// A closed set of names (config/enums.h), written as the name.
template <NamedEnum E>
struct Value<E> {
  static constexpr const char* kExpected = Value<std::string>::kExpected;
  static E parse(const YAML::Node& node, const Origin& origin) {
    const std::string text = Value<std::string>::parse(node, origin);
    if (auto value = from_name<E>(text)) return *value;
    throw UnknownName(unknown_name_message(origin.path, text, names(E{})));
  }
  static void emit(YAML::Emitter& out, E value) { Value<std::string>::emit(out, to_string(value)); }
  static std::string show(E value) { return in_quotes(name_of(value)); }
};

}  // namespace loom::config::detail
