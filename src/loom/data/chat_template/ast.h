#pragma once
// The parsed form of a Jinja template: expressions and statements, each with its position.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/data/chat_template/lexer.h"
#include "loom/data/chat_template/value.h"

namespace loom::data::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // items
    Tuple,      // items
    Dict,       // items: key, value, key, value, ...
    Attribute,  // a.name
    Subscript,  // a[b]
    Slice,      // a[items[0]:items[1]:items[2]] (null items are omitted bounds)
    Call,       // a(items..., keywords...)
    Filter,     // a | name(items..., keywords...)
    Test,       // a is [not] name(items...)
    Unary,      // name a: "not", "-", "+"
    Binary,     // a name b: or and == != < <= > >= in "not in" + - ~ * / // % **
    Ternary,    // a if b else c (c may be null: undefined)
  };
  // Each member but the first two defaults to empty, so an expression names only what it has.
  Kind kind;
  Position position;
  Value literal{};
  std::string name{};
  std::vector<ExprPtr> items{};
  std::vector<std::pair<std::string, ExprPtr>> keywords{};
  ExprPtr a{}, b{}, c{};
  bool negated = false;  // Test: `is not`
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches (condition, body); otherwise
    For,       // {% for targets in expr [if filter] %} body {% else %} otherwise
    Set,       // {% set target[.attribute] = expr %}, or targets = expr (unpacking)
    SetBlock,  // {% set target %} body {% endset %}
    Macro,     // {% macro target(params) %} body
    CallBlock, // {% call expr %} body: not supported at render (parse error)
    Break,
    Continue,
  };
  // Each member but the first two defaults to empty, so a statement names only what it has.
  Kind kind;
  Position position;
  std::string text{};
  ExprPtr expr{};
  ExprPtr filter{};
  std::vector<std::string> targets{};
  std::string attribute{};
  std::vector<std::pair<ExprPtr, Body>> branches{};
  std::vector<std::pair<std::string, ExprPtr>> params{};  // macro parameters and defaults (null: none)
  Body body{};
  Body otherwise{};
};

}  // namespace loom::data::jinja
