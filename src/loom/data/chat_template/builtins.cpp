// Jinja's filters, tests and globals as chat templates use them.
#include "loom/data/chat_template/builtins.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <set>

#include "loom/core/error.h"

namespace loom::data::jinja {

namespace {

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "trim",   "tojson", "length",  "count",  "upper",     "lower",     "default", "d",       "join",
      "first",  "last",   "list",    "string", "items",     "replace",   "capitalize", "title", "int",
      "float",  "abs",    "reverse", "sort",   "selectattr", "rejectattr", "map",   "unique",  "safe",
      "e",      "escape", "indent",  "round",  "sum",       "min",       "max",     "dictsort", "wordcount",
  };
  return names;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {
      "defined", "undefined", "none",     "string", "number",   "integer", "float", "boolean",  "mapping",
      "iterable", "sequence", "true",     "false",  "odd",      "even",    "divisibleby", "equalto", "eq",
      "ne",       "callable", "lower",    "upper",  "in",       "sameas",  "gt",    "lt",       "ge",  "le",
  };
  return names;
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return static_cast<int64_t>(iterate(v).size());
    case Value::Kind::List: return static_cast<int64_t>(v.list->size());
    case Value::Kind::Dict:
    case Value::Kind::Namespace: return static_cast<int64_t>(v.dict->size());
    case Value::Kind::Undefined: return 0;
    default: throw Error(std::string("length of a ") + v.type_name() + " is undefined");
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.string < b.string;
  throw Error(std::string("cannot compare ") + a.type_name() + " and " + b.type_name());
}

// An attribute path "a.b" of an item, as selectattr/map(attribute=) read it.
Value attribute_of(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      // An index; one beyond int64 stays the largest, which no list reaches (Python's is undefined too).
      int64_t index = std::numeric_limits<int64_t>::max();
      std::from_chars(part.data(), part.data() + part.size(), index);
      v = subscript(v, Value::from(index));
    } else {
      v = subscript(v, Value::from(part));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

Value select_items(const Value& input, Arguments& args, bool keep) {
  std::string attribute = argument(args, 0, "attribute").string;
  Value test = argument(args, 1, "test");
  List out;
  for (const Value& item : iterate(input)) {
    Value v = attribute_of(item, attribute);
    bool pass;
    if (test.is_undefined()) {
      pass = v.truthy();
    } else {
      Arguments rest;
      rest.positional.assign(args.positional.begin() + std::min<size_t>(2, args.positional.size()), args.positional.end());
      pass = apply_test(test.string, v, rest);
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::from(std::move(out));
}

std::string indent_text(const std::string& s, const Value& width, bool first, bool blank) {
  const std::string pad = width.is_string() ? width.string : std::string(static_cast<size_t>(width.is_undefined() ? 4 : width.integer), ' ');
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if ((!is_first || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
    is_first = false;
  }
  return out;
}

Value string_filter(const std::string& name, const Value& input, Arguments& args) {
  const std::string s = input.to_output();
  if (name == "trim") {
    size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return Value::from(s.substr(b, e - b));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" || name == "replace")
    return (*member(Value::from(s), name).call)(args);
  if (name == "indent")
    return Value::from(indent_text(s, argument(args, 0, "width"), argument(args, 1, "first").truthy(),
                                   argument(args, 2, "blank").truthy()));
  if (name == "wordcount") return Value::from(static_cast<int64_t>((*member(Value::from(s), "split").call)(args).list->size()));
  return Value::from(s);  // string, safe, e, escape (templates render text, not HTML)
}

Value list_filter(const std::string& name, const Value& input, Arguments& args) {
  List items = iterate(input);
  if (name == "list") return Value::from(std::move(items));
  if (name == "first") return items.empty() ? Value() : items.front();
  if (name == "last") return items.empty() ? Value() : items.back();
  if (name == "reverse") {
    if (input.is_string()) return slice(input, Value(), Value(), Value::from(int64_t{-1}));
    std::reverse(items.begin(), items.end());
    return Value::from(std::move(items));
  }
  if (name == "join") {
    std::string separator = argument(args, 0, "d", Value::from(std::string())).to_output();
    Value attribute = argument(args, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i)
      out += (i > 0 ? separator : "") + (attribute.is_undefined() ? items[i] : attribute_of(items[i], attribute.to_output())).to_output();
    return Value::from(out);
  }
  if (name == "selectattr" || name == "rejectattr") return select_items(input, args, name == "selectattr");
  if (name == "map") {
    Value attribute = argument(args, 99, "attribute");
    List out;
    for (const Value& item : items) {
      if (!attribute.is_undefined()) {
        out.push_back(attribute_of(item, attribute.to_output()));
      } else {
        Arguments rest;
        rest.positional.assign(args.positional.begin() + std::min<size_t>(1, args.positional.size()), args.positional.end());
        out.push_back(apply_filter(argument(args, 0, "filter").string, item, rest));
      }
    }
    return Value::from(std::move(out));
  }
  if (name == "unique") {
    List out;
    for (const Value& item : items)
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, item); })) out.push_back(item);
    return Value::from(std::move(out));
  }
  if (name == "sort") {
    Value attribute = argument(args, 2, "attribute");
    const bool reverse = argument(args, 0, "reverse").truthy();
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      return attribute.is_undefined() ? less(a, b) : less(attribute_of(a, attribute.string), attribute_of(b, attribute.string));
    });
    if (reverse) std::reverse(items.begin(), items.end());
    return Value::from(std::move(items));
  }
  if (name == "sum") {
    Value total = Value::from(int64_t{0});
    for (const Value& item : items)
      total = total.kind == Value::Kind::Int && item.kind == Value::Kind::Int ? Value::from(total.integer + item.integer)
                                                                              : Value::from(total.as_double() + item.as_double());
    return total;
  }
  if (items.empty()) return Value();
  return *std::max_element(items.begin(), items.end(),
                           [&](const Value& a, const Value& b) { return name == "max" ? less(a, b) : less(b, a); });
}

}  // namespace

bool is_known_filter(const std::string& name) { return filter_names().count(name) > 0; }
bool is_known_test(const std::string& name) { return test_names().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& input, Arguments& args) {
  if (!is_known_filter(name)) throw Error("unsupported filter '" + name + "'");
  if (name == "tojson") {
    Value indent = argument(args, 0, "indent");
    return Value::from(to_json(input, indent.kind == Value::Kind::Int ? static_cast<int>(indent.integer) : 0));
  }
  if (name == "length" || name == "count") return Value::from(length_of(input));
  if (name == "default" || name == "d") {
    const bool boolean = argument(args, 1, "boolean").truthy();
    const bool use_default = input.is_undefined() || (boolean && !input.truthy());
    return use_default ? argument(args, 0, "default_value", Value::from(std::string())) : input;
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::from(List{});
    if (!input.is_mapping()) throw Error(std::string("items filter needs a mapping, got ") + input.type_name());
    List out;
    for (const auto& [k, v] : *input.dict) out.push_back(Value::from(List{Value::from(k), v}));
    return Value::from(std::move(out));
  }
  if (name == "dictsort") {
    Value pairs = apply_filter("items", input, args);
    std::stable_sort(pairs.list->begin(), pairs.list->end(),
                     [](const Value& a, const Value& b) { return (*a.list)[0].string < (*b.list)[0].string; });
    return pairs;
  }
  if (name == "int") {
    if (input.kind == Value::Kind::Float) return Value::from(static_cast<int64_t>(input.number));
    if (input.kind == Value::Kind::Bool) return Value::from(static_cast<int64_t>(input.boolean));
    if (input.is_string()) {
      try { return Value::from(static_cast<int64_t>(std::stoll(input.string))); } catch (const std::exception&) {}
      return argument(args, 0, "default", Value::from(int64_t{0}));
    }
    return input.kind == Value::Kind::Int ? input : argument(args, 0, "default", Value::from(int64_t{0}));
  }
  if (name == "float") return Value::from(input.is_number() ? input.as_double() : input.is_string() ? std::strtod(input.string.c_str(), nullptr) : 0.0);
  if (name == "abs") return input.kind == Value::Kind::Int ? Value::from(input.integer < 0 ? -input.integer : input.integer) : Value::from(std::fabs(input.as_double()));
  if (name == "round") {
    const double scale = std::pow(10.0, static_cast<double>(argument(args, 0, "precision", Value::from(int64_t{0})).integer));
    return Value::from(std::round(input.as_double() * scale) / scale);
  }
  if (name == "list" || name == "first" || name == "last" || name == "reverse" || name == "join" || name == "selectattr" ||
      name == "rejectattr" || name == "map" || name == "unique" || name == "sort" || name == "sum" || name == "min" || name == "max")
    return list_filter(name, input, args);
  return string_filter(name, input, args);
}

bool apply_test(const std::string& name, const Value& v, Arguments& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == K::Int;
  if (name == "float") return v.kind == K::Float;
  if (name == "boolean") return v.kind == K::Bool;
  if (name == "true") return v.kind == K::Bool && v.boolean;
  if (name == "false") return v.kind == K::Bool && !v.boolean;
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.kind == K::List || v.is_mapping() || v.is_string();
  if (name == "sequence") return v.kind == K::List || v.is_string() || v.is_mapping();
  if (name == "callable") return v.kind == K::Callable;
  if (name == "odd" || name == "even") {
    if (v.kind != K::Int) throw Error(std::string("test '") + name + "' needs an integer, got " + v.type_name());
    return (v.integer % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    Value d = argument(args, 0, "num");
    return v.kind == K::Int && d.kind == K::Int && d.integer != 0 && v.integer % d.integer == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return std::none_of(v.string.begin(), v.string.end(), [&](char c) {
      return name == "lower" ? std::isupper(static_cast<unsigned char>(c)) : std::islower(static_cast<unsigned char>(c));
    });
  }
  Value other = argument(args, 0, "other");
  if (name == "equalto" || name == "eq" || name == "sameas") return equal(v, other);
  if (name == "ne") return !equal(v, other);
  if (name == "gt") return less(other, v);
  if (name == "lt") return less(v, other);
  if (name == "ge") return !less(v, other);
  if (name == "le") return !less(other, v);
  if (name == "in") {
    if (other.is_string()) return v.is_string() && other.string.find(v.string) != std::string::npos;
    for (const Value& item : iterate(other))
      if (equal(item, v)) return true;
    return false;
  }
  throw Error("unsupported test '" + name + "'");
}

Dict global_functions() {
  Dict globals;
  globals.emplace_back("namespace", Value::function("namespace", [](Arguments& a) {
    Dict fields;
    if (!a.positional.empty() && a.positional[0].is_mapping()) fields = *a.positional[0].dict;
    for (auto& [k, v] : a.keyword) fields.emplace_back(k, v);
    return Value::namespace_of(std::move(fields));
  }));
  globals.emplace_back("dict", Value::function("dict", [](Arguments& a) {
    Dict fields;
    for (auto& [k, v] : a.keyword) fields.emplace_back(k, v);
    return Value::from(std::move(fields));
  }));
  globals.emplace_back("range", Value::function("range", [](Arguments& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) stop = a.positional[0].integer;
    if (a.positional.size() >= 2) { start = a.positional[0].integer; stop = a.positional[1].integer; }
    if (a.positional.size() >= 3) step = a.positional[2].integer;
    if (step == 0) throw Error("range() step must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::from(i));
    return Value::from(std::move(out));
  }));
  globals.emplace_back("raise_exception", Value::function("raise_exception", [](Arguments& a) -> Value {
    throw Error("raise_exception: " + argument(a, 0, "message").to_output());
  }));
  globals.emplace_back("strftime_now", Value::function("strftime_now", [](Arguments& a) {
    std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[256];
    size_t n = std::strftime(buffer, sizeof(buffer), argument(a, 0, "format").to_output().c_str(), &local);
    return Value::from(std::string(buffer, n));
  }));
  return globals;
}

}  // namespace loom::data::jinja
