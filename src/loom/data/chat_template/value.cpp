#include "loom/data/chat_template/value.h"

#include <cmath>
#include <cstdio>

namespace loom::data::jinja {

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return boolean;
    case Kind::Int: return integer != 0;
    case Kind::Float: return number != 0;
    case Kind::String: return !string.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return !dict->empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

namespace {

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == std::floor(d) && std::fabs(d) < 1e16) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%.1f", d);
    return buffer;
  }
  // The shortest form that reads back as the same double, as Python's repr.
  for (int precision = 1; precision <= 17; ++precision) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, d);
    if (std::strtod(buffer, nullptr) == d) return buffer;
  }
  return std::to_string(d);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string Value::to_output() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return boolean ? "True" : "False";
    case Kind::Int: return std::to_string(integer);
    case Kind::Float: return format_float(number);
    case Kind::String: return string;
    case Kind::Callable: return "<function " + callable_name + ">";
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace: return to_json(*this, 0);
  }
  return "";
}

const Value* Value::find(const std::string& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "namespace";
    case Kind::Callable: return "function";
  }
  return "?";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Int && b.kind == Value::Kind::Int) return a.integer == b.integer;
    return a.as_double() == b.as_double();
  }
  if (a.kind == Value::Kind::Bool && b.kind == Value::Kind::Bool) return a.boolean == b.boolean;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.string == b.string;
    case Value::Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* other = b.find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    case Value::Kind::Callable: return a.call == b.call;
    default: return false;
  }
}

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::from(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::from(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::from(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::from(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::from(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      for (const auto& item : json) list.push_back(from_json(item));
      return Value::from(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [k, v] : json.items()) dict.emplace_back(k, from_json(v));
      return Value::from(std::move(dict));
    }
    default: return Value::none();
  }
}

std::string to_json(const Value& value, int indent, int depth) {
  const std::string item_separator = indent > 0 ? "," : ", ";
  std::string pad(static_cast<size_t>(indent * depth) + 1, ' ');
  pad.front() = '\n';
  const std::string child_pad = pad + std::string(static_cast<size_t>(indent), ' ');
  switch (value.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return "null";
    case Value::Kind::Bool: return value.boolean ? "true" : "false";
    case Value::Kind::Int: return std::to_string(value.integer);
    case Value::Kind::Float: {
      // JSON.stringify writes integral doubles without a fraction.
      std::string s = format_float(value.number);
      return s.ends_with(".0") ? s.substr(0, s.size() - 2) : s;
    }
    case Value::Kind::String: return json_string(value.string);
    case Value::Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < value.list->size(); ++i) {
        out += (i > 0 ? item_separator : "") + (indent > 0 ? child_pad : "");
        out += to_json((*value.list)[i], indent, depth + 1);
      }
      return out + (indent > 0 && !value.list->empty() ? pad : "") + "]";
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      std::string out = "{";
      for (size_t i = 0; i < value.dict->size(); ++i) {
        out += (i > 0 ? item_separator : "") + (indent > 0 ? child_pad : "");
        out += json_string((*value.dict)[i].first) + ": " + to_json((*value.dict)[i].second, indent, depth + 1);
      }
      return out + (indent > 0 && !value.dict->empty() ? pad : "") + "}";
    }
    case Value::Kind::Callable: return "null";
  }
  return "null";
}

}  // namespace loom::data::jinja
