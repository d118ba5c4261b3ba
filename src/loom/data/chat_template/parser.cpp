#include "loom/data/chat_template/parser.h"

#include <cstdlib>
#include <initializer_list>

#include "loom/core/error.h"
#include "loom/data/chat_template/builtins.h"

namespace loom::data::jinja {

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& origin) : tokens_(tokens), origin_(origin) {}

  Body parse_template() {
    std::string stopped_at;
    Body body = parse_body({}, stopped_at);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Operator && peek(ahead).text == op;
  }
  bool at_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Name && peek(ahead).text == name;
  }

  [[noreturn]] void fail(const Position& p, const std::string& what) const {
    throw Error("chat template " + origin_ + " line " + std::to_string(p.line) + ":" + std::to_string(p.column) +
                ": " + what);
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokenKind::End: return "the end of the template";
      case TokenKind::StmtClose: return "'%}'";
      case TokenKind::ExprClose: return "'}}'";
      case TokenKind::Text: return "text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!at_op(op)) fail(peek().position, std::string("expected '") + op + "', found " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::Name) fail(peek().position, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_kind(TokenKind kind, const char* what) {
    if (peek().kind != kind) fail(peek().position, std::string("expected ") + what + ", found " + describe(peek()));
    next();
  }

  // Statements until a `{% keyword %}` in `stops` (consumed up to the keyword; its name returned).
  Body parse_body(std::initializer_list<const char*> stops, std::string& stopped_at) {
    Body body;
    while (peek().kind != TokenKind::End) {
      const Token& t = peek();
      if (t.kind == TokenKind::Text) {
        body.push_back(Stmt{Stmt::Kind::Text, t.position, t.text});
        next();
      } else if (t.kind == TokenKind::ExprOpen) {
        next();
        Stmt s{Stmt::Kind::Output, t.position};
        s.expr = parse_expression();
        expect_kind(TokenKind::ExprClose, "'}}'");
        body.push_back(std::move(s));
      } else {
        const Token& keyword = peek(1);
        for (const char* stop : stops)
          if (keyword.kind == TokenKind::Name && keyword.text == stop) {
            next();
            next();
            stopped_at = stop;
            return body;
          }
        next();
        body.push_back(parse_statement());
      }
    }
    if (stops.size() > 0) {
      std::string expected;
      for (const char* stop : stops) expected += (expected.empty() ? "" : " or ") + std::string("{% ") + stop + " %}";
      fail(peek().position, "unexpected end of template; expected " + expected);
    }
    return body;
  }

  Stmt parse_statement() {
    const Token& keyword = next();
    if (keyword.kind != TokenKind::Name) fail(keyword.position, "expected a statement keyword after '{%'");
    const std::string& k = keyword.text;
    if (k == "if") return parse_if(keyword.position);
    if (k == "for") return parse_for(keyword.position);
    if (k == "set") return parse_set(keyword.position);
    if (k == "macro") return parse_macro(keyword.position);
    if (k == "break" || k == "continue") {
      expect_kind(TokenKind::StmtClose, "'%}'");
      return Stmt{k == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, keyword.position};
    }
    if (k == "generation") {  // transformers' assistant-mask marker: renders its body as is
      expect_kind(TokenKind::StmtClose, "'%}'");
      std::string stopped;
      Stmt s{Stmt::Kind::If, keyword.position};
      auto always = std::make_unique<Expr>(Expr{Expr::Kind::Literal, keyword.position, Value::from(true)});
      s.branches.emplace_back(std::move(always), parse_body({"endgeneration"}, stopped));
      expect_kind(TokenKind::StmtClose, "'%}'");
      return s;
    }
    fail(keyword.position, "unsupported construct '{% " + k + " %}' (supported statements: if, for, set, macro, "
                           "break, continue, generation)");
  }

  Stmt parse_if(const Position& where) {
    Stmt s{Stmt::Kind::If, where};
    ExprPtr condition = parse_expression();
    expect_kind(TokenKind::StmtClose, "'%}'");
    while (true) {
      std::string stopped;
      Body body = parse_body({"elif", "else", "endif"}, stopped);
      s.branches.emplace_back(std::move(condition), std::move(body));
      if (stopped == "elif") {
        condition = parse_expression();
        expect_kind(TokenKind::StmtClose, "'%}'");
        continue;
      }
      expect_kind(TokenKind::StmtClose, "'%}'");
      if (stopped == "else") {
        s.otherwise = parse_body({"endif"}, stopped);
        expect_kind(TokenKind::StmtClose, "'%}'");
      }
      return s;
    }
  }

  Stmt parse_for(const Position& where) {
    Stmt s{Stmt::Kind::For, where};
    s.targets.push_back(expect_name());
    while (at_op(",")) {
      next();
      s.targets.push_back(expect_name());
    }
    if (!at_name("in")) fail(peek().position, "expected 'in' in a for loop, found " + describe(peek()));
    next();
    s.expr = parse_ternary(false);
    if (at_name("if")) {
      next();
      s.filter = parse_ternary(false);
    }
    if (at_name("recursive")) fail(peek().position, "unsupported construct 'recursive' loops");
    expect_kind(TokenKind::StmtClose, "'%}'");
    std::string stopped;
    s.body = parse_body({"else", "endfor"}, stopped);
    expect_kind(TokenKind::StmtClose, "'%}'");
    if (stopped == "else") {
      s.otherwise = parse_body({"endfor"}, stopped);
      expect_kind(TokenKind::StmtClose, "'%}'");
    }
    return s;
  }

  Stmt parse_set(const Position& where) {
    Stmt s{Stmt::Kind::Set, where};
    s.targets.push_back(expect_name());
    if (at_op(".")) {
      next();
      s.attribute = expect_name();
    }
    while (at_op(",")) {
      next();
      s.targets.push_back(expect_name());
    }
    if (peek().kind == TokenKind::StmtClose && s.targets.size() == 1 && s.attribute.empty()) {
      next();
      s.kind = Stmt::Kind::SetBlock;
      std::string stopped;
      s.body = parse_body({"endset"}, stopped);
      expect_kind(TokenKind::StmtClose, "'%}'");
      return s;
    }
    expect_op("=");
    s.expr = parse_tuple_or_expression();
    expect_kind(TokenKind::StmtClose, "'%}'");
    return s;
  }

  Stmt parse_macro(const Position& where) {
    Stmt s{Stmt::Kind::Macro, where};
    s.targets.push_back(expect_name());
    expect_op("(");
    while (!at_op(")")) {
      std::string param = expect_name();
      ExprPtr fallback;
      if (at_op("=")) {
        next();
        fallback = parse_expression();
      }
      s.params.emplace_back(param, std::move(fallback));
      if (!at_op(",")) break;
      next();
    }
    expect_op(")");
    expect_kind(TokenKind::StmtClose, "'%}'");
    std::string stopped;
    s.body = parse_body({"endmacro"}, stopped);
    expect_kind(TokenKind::StmtClose, "'%}'");
    return s;
  }

  ExprPtr make(Expr::Kind kind, const Position& where) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->position = where;
    return e;
  }

  // `a, b` without parentheses (set's right-hand side) is a tuple.
  ExprPtr parse_tuple_or_expression() {
    Position where = peek().position;
    ExprPtr first = parse_expression();
    if (!at_op(",")) return first;
    ExprPtr tuple = make(Expr::Kind::Tuple, where);
    tuple->items.push_back(std::move(first));
    while (at_op(",")) {
      next();
      tuple->items.push_back(parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression() { return parse_ternary(true); }

  ExprPtr parse_ternary(bool allow_conditional) {
    ExprPtr value = parse_or();
    while (allow_conditional && at_name("if")) {
      Position where = next().position;
      ExprPtr e = make(Expr::Kind::Ternary, where);
      e->a = std::move(value);
      e->b = parse_or();
      if (at_name("else")) {
        next();
        e->c = parse_ternary(true);
      }
      value = std::move(e);
    }
    return value;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, const Position& where) {
    ExprPtr e = make(Expr::Kind::Binary, where);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      Position where = next().position;
      left = binary("or", std::move(left), parse_and(), where);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      Position where = next().position;
      left = binary("and", std::move(left), parse_not(), where);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      Position where = next().position;
      ExprPtr e = make(Expr::Kind::Unary, where);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    while (true) {
      Position where = peek().position;
      std::string op;
      for (const char* o : {"==", "!=", "<", "<=", ">", ">="})
        if (at_op(o)) op = o;
      if (!op.empty()) {
        next();
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return left;
      }
      left = binary(op, std::move(left), parse_math1(), where);
    }
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& op = next();
      left = binary(op.text, std::move(left), parse_concat(), op.position);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      const Token& op = next();
      left = binary("~", std::move(left), parse_math2(), op.position);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& op = next();
      left = binary(op.text, std::move(left), parse_pow(), op.position);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary();
    while (at_op("**")) {
      const Token& op = next();
      left = binary("**", std::move(left), parse_unary(), op.position);
    }
    return left;
  }

  ExprPtr parse_unary() {
    if (at_op("-") || at_op("+")) {
      const Token& op = next();
      ExprPtr e = make(Expr::Kind::Unary, op.position);
      e->name = op.text;
      e->a = parse_unary();
      return e;
    }
    return parse_filters(parse_postfix(parse_primary()));
  }

  // (args, key=value) after '(' was consumed, up to and including ')'.
  void parse_arguments(Expr& e) {
    while (!at_op(")")) {
      if (peek().kind == TokenKind::Name && at_op("=", 1)) {
        std::string key = next().text;
        next();
        e.keywords.emplace_back(key, parse_expression());
      } else {
        e.items.push_back(parse_expression());
      }
      if (!at_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr value) {
    while (true) {
      if (at_op("|")) {
        next();
        const Token& name = peek();
        std::string filter = expect_name();
        if (!is_known_filter(filter)) fail(name.position, "unsupported filter '" + filter + "'");
        ExprPtr e = make(Expr::Kind::Filter, name.position);
        e->name = filter;
        e->a = std::move(value);
        if (at_op("(")) {
          next();
          parse_arguments(*e);
        }
        value = std::move(e);
      } else if (at_name("is")) {
        next();
        ExprPtr e = make(Expr::Kind::Test, peek().position);
        if (at_name("not")) {
          next();
          e->negated = true;
        }
        const Token& name = peek();
        // none/true/false are names of tests here, not literals.
        std::string test = expect_name();
        if (!is_known_test(test)) fail(name.position, "unsupported test '" + test + "'");
        e->name = test;
        e->a = std::move(value);
        if (at_op("(")) {
          next();
          parse_arguments(*e);
        } else if (peek().kind == TokenKind::String || peek().kind == TokenKind::Integer ||
                   (peek().kind == TokenKind::Name && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("is") && !at_name("in") && !at_name("not"))) {
          e->items.push_back(parse_primary());  // `is divisibleby 3`, `is sameas x`
        }
        value = std::move(e);
      } else {
        return value;
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr value) {
    while (true) {
      if (at_op(".")) {
        Position where = next().position;
        ExprPtr e = make(Expr::Kind::Attribute, where);
        if (peek().kind == TokenKind::Integer) {
          e->name = next().text;
        } else {
          e->name = expect_name();
        }
        e->a = std::move(value);
        value = std::move(e);
      } else if (at_op("[")) {
        value = parse_subscript(std::move(value));
      } else if (at_op("(")) {
        Position where = next().position;
        ExprPtr e = make(Expr::Kind::Call, where);
        e->a = std::move(value);
        parse_arguments(*e);
        value = std::move(e);
      } else {
        return value;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr value) {
    Position where = next().position;
    std::vector<ExprPtr> parts(1);
    int colons = 0;
    while (!at_op("]")) {
      if (at_op(":")) {
        next();
        if (++colons > 2) fail(where, "a slice takes at most start:stop:step");
        parts.emplace_back();
      } else {
        if (parts.back()) fail(peek().position, "expected ':' or ']' in a subscript, found " + describe(peek()));
        parts.back() = parse_expression();
      }
    }
    next();
    if (colons == 0) {
      if (!parts[0]) fail(where, "empty subscript '[]'");
      ExprPtr e = make(Expr::Kind::Subscript, where);
      e->a = std::move(value);
      e->b = std::move(parts[0]);
      return e;
    }
    ExprPtr e = make(Expr::Kind::Slice, where);
    e->a = std::move(value);
    parts.resize(3);
    e->items = std::move(parts);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.kind) {
      case TokenKind::String: {
        std::string text = t.text;
        while (peek().kind == TokenKind::String) text += next().text;  // adjacent literals join
        ExprPtr e = make(Expr::Kind::Literal, t.position);
        e->literal = Value::from(std::move(text));
        return e;
      }
      case TokenKind::Integer: {
        ExprPtr e = make(Expr::Kind::Literal, t.position);
        try {
          e->literal = Value::from(static_cast<int64_t>(std::stoll(t.text)));
        } catch (const std::exception&) {
          fail(t.position, "integer literal " + t.text + " is out of range");
        }
        return e;
      }
      case TokenKind::Float: {
        ExprPtr e = make(Expr::Kind::Literal, t.position);
        // Beyond a double's range: inf, as Python's float() and JavaScript's parseFloat read it.
        e->literal = Value::from(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case TokenKind::Name: return parse_name(t);
      case TokenKind::Operator:
        if (t.text == "(") return parse_parenthesised(t.position);
        if (t.text == "[") return parse_list(t.position);
        if (t.text == "{") return parse_dict(t.position);
        break;
      default: break;
    }
    fail(t.position, "expected an expression, found " + describe(t));
  }

  ExprPtr parse_name(const Token& t) {
    ExprPtr e = make(Expr::Kind::Literal, t.position);
    if (t.text == "true" || t.text == "True") e->literal = Value::from(true);
    else if (t.text == "false" || t.text == "False") e->literal = Value::from(false);
    else if (t.text == "none" || t.text == "None") e->literal = Value::none();
    else {
      e->kind = Expr::Kind::Name;
      e->name = t.text;
    }
    return e;
  }

  ExprPtr parse_parenthesised(const Position& where) {
    if (at_op(")")) {
      next();
      return make(Expr::Kind::Tuple, where);
    }
    ExprPtr first = parse_expression();
    if (at_op(")")) {
      next();
      return first;
    }
    ExprPtr tuple = make(Expr::Kind::Tuple, where);
    tuple->items.push_back(std::move(first));
    while (at_op(",")) {
      next();
      if (at_op(")")) break;
      tuple->items.push_back(parse_expression());
    }
    expect_op(")");
    return tuple;
  }

  ExprPtr parse_list(const Position& where) {
    ExprPtr list = make(Expr::Kind::List, where);
    while (!at_op("]")) {
      list->items.push_back(parse_expression());
      if (!at_op(",")) break;
      next();
    }
    expect_op("]");
    return list;
  }

  ExprPtr parse_dict(const Position& where) {
    ExprPtr dict = make(Expr::Kind::Dict, where);
    while (!at_op("}")) {
      dict->items.push_back(parse_expression());
      expect_op(":");
      dict->items.push_back(parse_expression());
      if (!at_op(",")) break;
      next();
    }
    expect_op("}");
    return dict;
  }

  const std::vector<Token>& tokens_;
  const std::string& origin_;
  size_t pos_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& origin) {
  return Parser(tokens, origin).parse_template();
}

}  // namespace loom::data::jinja
