// The Jinja interpreter's whitespace rules, scoping and errors, named chat templates in
// tokenizer_config.json, and loom's built-in template. (Real templates are compared with
// @huggingface/jinja by tests/scripts/hf/compare_chat_templates.mjs.)
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/chat_template/chat_template.h"
#include "loom/data/tokenizer.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

std::string render(const std::string& source, const ordered_json& messages = ordered_json::array(),
                   bool add_generation_prompt = false) {
  auto t = make_chat_template("test", "test.jinja", source, "<s>", "</s>");
  return render_chat(*t, messages, nullptr, add_generation_prompt);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_error(const std::string& source, std::initializer_list<const char*> parts) {
  std::string message = error_of([&] { render(source); });
  for (const char* part : parts) EXPECT_NE(message.find(part), std::string::npos) << source << "\n" << message;
}

TEST(ChatTemplate, WhitespaceRulesAsTransformersRendersThem) {
  // trim_blocks and lstrip_blocks, `-` at either edge, and one trailing newline dropped.
  EXPECT_EQ(render("  {% if true %}\nx\n  {% endif %}\ny\n"), "x\ny");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a {{- ' b ' -}} c"), "a b c");
  EXPECT_EQ(render("{# note #}\nx"), "x");
  EXPECT_EQ(render("a {{ 'b' }}\nc"), "a b\nc");  // no trim after an expression
}

TEST(ChatTemplate, ScopesLoopsAndNamespaces) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}"), "2");
  EXPECT_EQ(render("{% for i in 'abc' %}{{ loop.index }}{{ loop.revindex0 }}{% if loop.last %}!{% endif %}{% endfor %}"),
            "122130!");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for i in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "012");
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "[1B][23]");
  EXPECT_EQ(render("{% set x %}in{{ 1 + 1 }}{% endset %}{{ x }}"), "in2");
}

TEST(ChatTemplate, PythonSemanticsOfValues) {
  EXPECT_EQ(render("{{ [1, 2, 3][::-1] }} {{ 'hello'[1:3] }} {{ [1, 2, 3][-1] }}"), "[3, 2, 1] el 3");
  EXPECT_EQ(render("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 8 }}"), "-4 2 3.5 256");
  EXPECT_EQ(render("{{ true }} {{ none }} {{ 1.0 }} {{ undefined }}|"), "True None 1.0 |");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 'x']} | tojson }}"), "{\"b\": 1, \"a\": [1, \"x\"]}");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ 'a b  c'.split() | length }} {{ 'x' if 1 in [1] else 'y' }} {{ 'The_end'.title() }}"), "3 x The_End");
  EXPECT_EQ(render("{{ messages[0]['content'] | trim }}{{ bos_token }}", ordered_json::parse(R"([{"role": "user", "content": " hi "}])")),
            "hi<s>");
  // Beyond the number types' range: a float literal is inf (Python's float(), JavaScript's
  // parseFloat), an attribute path's index reaches no element.
  EXPECT_EQ(render("{{ " + std::string(400, '1') + ".5 }} {{ -" + std::string(400, '9') + ".0 }}"), "inf -inf");
  EXPECT_EQ(render("{{ [[1, 2]] | map(attribute='1') | first }} "
                   "{{ ([[1, 2]] | map(attribute='99999999999999999999') | first) is undefined }}"),
            "2 True");
}

TEST(ChatTemplate, UnsupportedConstructsAreNamedWithTheirPosition) {
  expect_error("ab\n  {% include 'other.jinja' %}", {"test.jinja", "line 2:", "unsupported construct '{% include %}'"});
  expect_error("{% extends 'base' %}", {"unsupported construct '{% extends %}'"});
  expect_error("{{ x | wordwrap(3) }}", {"line 1:8", "unsupported filter 'wordwrap'"});
  expect_error("{{ x is sequenceish }}", {"unsupported test 'sequenceish'"});
  expect_error("{{ 'a'.zfill(3) }}", {"line 1:", "cannot call method 'zfill'", "unsupported function or method"});
  expect_error("{{ cycler() }}", {"cannot call 'cycler'"});
  expect_error("{% for x in y %}", {"unexpected end of template", "{% endfor %}"});
  expect_error("{{ 'open", {"unterminated string"});
  expect_error("{{ 1 + }}", {"expected an expression"});
  expect_error("{% set x.y = 1 %}", {"cannot set attribute 'y' of 'x'"});
  expect_error("{{ raise_exception('Only user and assistant roles are supported') }}",
               {"raise_exception: Only user and assistant roles are supported"});
}

TEST(ChatTemplate, NamedTemplatesInTokenizerConfig) {
  const fs::path dir = fs::temp_directory_path() / ("loom-chat-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string config = (dir / "tokenizer_config.json").string();
  write_file_atomic(config, R"({"bos_token": {"content": "<bos>"}, "eos_token": "<eos>", "chat_template": [
      {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}, {"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(render_chat(*load_chat_template(config), ordered_json::array(), nullptr, false), "<bos>D<eos>");
  EXPECT_EQ(render_chat(*load_chat_template(config, "tool_use"), ordered_json::array(), nullptr, false), "T");
  std::string message = error_of([&] { load_chat_template(config, "rag"); });
  EXPECT_NE(message.find("no chat template named 'rag'"), std::string::npos) << message;
  EXPECT_NE(message.find("default, tool_use"), std::string::npos) << message;
  write_file_atomic(config, R"({"eos_token": "<eos>"})");
  message = error_of([&] { load_chat_template(config); });
  EXPECT_NE(message.find("has no 'chat_template'"), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(ChatTemplate, BuiltInChatmlForLoomsOwnTokenizers) {
  auto byte = make_tokenizer("byte");
  auto chat = byte->chat_template();
  EXPECT_EQ(chat->name, "chatml");
  const auto messages = ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])");
  EXPECT_EQ(render_chat(*chat, messages, nullptr, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n");
  // The markers are plain text to the byte tokenizer: they round-trip.
  const std::string text = render_chat(*chat, messages, nullptr, false);
  const std::vector<int32_t> ids = byte->encode(text, EncodeOptions{});
  EXPECT_EQ(byte->decode(ids), text);
}

}  // namespace
}  // namespace loom::data
