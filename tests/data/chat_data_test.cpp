// Chat data: JSONL parsing with errors by file and line, the deterministic split, loss masks
// from rendered prefixes, first-fit-decreasing packing and the rows it makes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "loom/core/error.h"
#include "loom/data/chat/chat_dataset.h"
#include "loom/data/chat/packing.h"
#include "support/test_paths.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

std::string write_jsonl(const std::string& name, const std::string& text) {
  const std::string path = (fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".jsonl")).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string problem_of(const std::string& line) {
  Conversation c;
  auto bad = parse_conversation(line, c);
  return bad ? *bad : "";
}

TEST(ChatData, ParsesBothFormsAndToolCalls) {
  Conversation c;
  ASSERT_FALSE(parse_conversation(
      R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},)"
      R"({"role":"tool","tool_call_id":"1","content":"42"},{"role":"assistant","content":"a"}],"tools":[{"type":"function"}]})",
      c));
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(c.messages[3].tool_call_id, "1");
  EXPECT_EQ(c.tools.size(), 1u);
  Conversation p;
  ASSERT_FALSE(parse_conversation(R"({"input":"2+2?","output":"4","system":"be brief"})", p));
  ASSERT_EQ(p.messages.size(), 3u);
  EXPECT_EQ(p.messages[1].role, "user");
  EXPECT_EQ(p.messages[2].content, "4");
}

TEST(ChatData, EachProblemIsNamed) {
  EXPECT_NE(problem_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(problem_of("[1]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(problem_of(R"({"text":"x"})").find("neither \"messages\""), std::string::npos);
  EXPECT_NE(problem_of(R"({"messages":[]})").find("empty"), std::string::npos);
  EXPECT_NE(problem_of(R"({"messages":[{"role":"bot","content":"x"}]})").find("messages[0].role = \"bot\""),
            std::string::npos);
  EXPECT_NE(problem_of(R"({"messages":[{"role":"user","content":3}]})").find("messages[0].content must be a string"),
            std::string::npos);
  EXPECT_NE(problem_of(R"({"messages":[{"role":"user"}]})").find("no \"content\""), std::string::npos);
  EXPECT_NE(problem_of(R"({"input":"x"})").find("no \"output\""), std::string::npos);
  for (const char* type : {"5", "null", "[\"text\"]", "{}"}) {
    const std::string line =
        R"({"messages":[{"role":"user","content":[{"type":)" + std::string(type) + R"(,"text":"x"}]}]})";
    EXPECT_NE(problem_of(line).find("messages[0].content holds a part that is not"), std::string::npos) << line;
  }
}

TEST(ChatData, ABadLineIsFatalNamingFileAndLineOrSkipped) {
  const std::string path = write_jsonl("chat-bad", "{\"input\":\"a\",\"output\":\"b\"}\n\n{\"input\":\"a\"}\n");
  ChatLoadReport report;
  try {
    load_conversations({path}, false, report);
    FAIL() << "a bad line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3: has \"input\" but no \"output\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sft.bad_lines=skip"), std::string::npos);
  }
  ChatLoadReport skipped;
  EXPECT_EQ(load_conversations({path}, true, skipped).size(), 1u);
  ASSERT_EQ(skipped.problems.size(), 1u);
  EXPECT_EQ(skipped.problems[0].rfind(path + ":3:", 0), 0u);
  EXPECT_THROW(load_conversations({path + ".missing"}, true, skipped), Error);
  fs::remove(path);
}

TEST(ChatData, TheSplitIsDeterministicAndNearTheFraction) {
  int held_out = 0;
  for (int64_t i = 0; i < 10000; ++i) {
    const bool v = in_validation(7, i, 0.1);
    EXPECT_EQ(v, in_validation(7, i, 0.1));
    held_out += v;
  }
  EXPECT_NEAR(held_out, 1000, 100);
  int differ = 0;
  for (int64_t i = 0; i < 1000; ++i) differ += in_validation(7, i, 0.1) != in_validation(8, i, 0.1);
  EXPECT_GT(differ, 50);  // another seed, another split
}

Conversation two_turns() {
  Conversation c;
  parse_conversation(R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},)"
                     R"({"role":"assistant","content":"A1"},{"role":"user","content":"Q2"},{"role":"assistant","content":"A2"}]})",
                     c);
  return c;
}

// The trained text of a tokenized conversation (byte tokenizer: token = byte).
std::string trained_text(const TokenizedConversation& t) {
  std::string text;
  for (size_t i = 0; i < t.tokens.size(); ++i)
    if (t.trained[i]) text += static_cast<char>(t.tokens[i]);
  return text;
}

TEST(ChatMasks, OnlyTheAssistantsAnswersAreTrainedByDefault) {
  const auto byte = make_tokenizer("byte");
  const auto chatml = make_chat_format("chatml", *byte);
  TokenizedConversation t;
  ASSERT_FALSE(tokenize_conversation(two_turns(), *chatml, *byte, MaskOptions{}, t));
  const std::string full = chatml->render(messages_json(two_turns().messages), nlohmann::json::array(), false);
  EXPECT_EQ(std::string(t.tokens.begin(), t.tokens.end()), full);
  EXPECT_EQ(trained_text(t), "A1<|im_end|>\nA2<|im_end|>\n");
  MaskOptions last;
  last.last_turn_only = true;
  ASSERT_FALSE(tokenize_conversation(two_turns(), *chatml, *byte, last, t));
  EXPECT_EQ(trained_text(t), "A2<|im_end|>\n");
  MaskOptions users;
  users.roles = {"user"};
  ASSERT_FALSE(tokenize_conversation(two_turns(), *chatml, *byte, users, t));
  EXPECT_EQ(trained_text(t), "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n");
}

std::string hf_dir(const std::string& name) {
  const fs::path dir = fs::path(loom::test_paths::data_dir()) / "hf" / name;
  if (!fs::is_regular_file(dir / "tokenizer_config.json"))
    throw Error(dir.string() + " missing; run scripts/setup.sh to fetch the verified data");
  return dir.string();
}

// The decoded text of the trained tokens (special tokens written out), and of all tokens.
std::string decoded(const Tokenizer& tokenizer, const TokenizedConversation& t, bool trained_only) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t.tokens.size(); ++i)
    if (!trained_only || t.trained[i]) ids.push_back(t.tokens[i]);
  return tokenizer.decode(ids);
}

// Llama 3's template appends the assistant's header to every rendering, whatever
// add_generation_prompt says: its renderings less that header are attributed, and the answers
// with their <|eot_id|> are what is trained.
TEST(ChatMasks, ATemplateThatAlwaysAppendsTheAssistantHeaderIsAttributed) {
  const auto llama3 = make_tokenizer("hf:" + hf_dir("llama3"));
  const auto format = make_chat_format("tokenizer", *llama3);
  TokenizedConversation t;
  const auto problem = tokenize_conversation(two_turns(), *format, *llama3, MaskOptions{}, t);
  ASSERT_FALSE(problem) << *problem;
  EXPECT_EQ(decoded(*llama3, t, true), "A1<|eot_id|>A2<|eot_id|>");
  const std::string header = "<|start_header_id|>";
  EXPECT_EQ(decoded(*llama3, t, false),
            "<|begin_of_text|>" + header + "system<|end_header_id|>\n\nS<|eot_id|>" + header +
                "user<|end_header_id|>\n\nQ1<|eot_id|>" + header + "assistant<|end_header_id|>\n\nA1<|eot_id|>" +
                header + "user<|end_header_id|>\n\nQ2<|eot_id|>" + header +
                "assistant<|end_header_id|>\n\nA2<|eot_id|>");
  // The pieces are tokenized at message boundaries, as the whole text would be.
  EXPECT_EQ(t.tokens, llama3->encode(decoded(*llama3, t, false), EncodeOptions{}));
}

// Qwen 3's template writes an empty thinking block into the last assistant turn only: one turn
// is attributed (the block is part of the trained answer), a later turn that drops it from an
// earlier answer is reported as not prefix stable.
TEST(ChatMasks, QwenThreeTrainsItsThinkingBlockAndReportsRewrittenTurns) {
  const auto qwen = make_tokenizer("hf:" + hf_dir("qwen3"));
  const auto format = make_chat_format("tokenizer", *qwen);
  Conversation one;
  ASSERT_FALSE(parse_conversation(R"({"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]})", one));
  TokenizedConversation t;
  const auto problem = tokenize_conversation(one, *format, *qwen, MaskOptions{}, t);
  ASSERT_FALSE(problem) << *problem;
  EXPECT_EQ(decoded(*qwen, t, true), "<think>\n\n</think>\n\nA<|im_end|>\n");
  const auto rewritten = tokenize_conversation(two_turns(), *format, *qwen, MaskOptions{}, t);
  ASSERT_TRUE(rewritten);
  EXPECT_NE(rewritten->find("not prefix stable at messages[3]"), std::string::npos) << *rewritten;
}

// Split into one example per answer (tokenize_turns), Qwen 3's conversation trains each answer
// after the prompt its template renders for it: the first answer with its empty thinking block
// after [S, Q1]; the second after a history whose first answer has lost that block, as Qwen 3
// shows it at inference. Each example's tokens are the rendered text's, prompt and answer each
// tokenized whole.
TEST(ChatMasks, QwenThreeTurnsSplitIntoOneExamplePerAnswerWithTheirInferenceHistory) {
  const auto qwen = make_tokenizer("hf:" + hf_dir("qwen3"));
  const auto format = make_chat_format("tokenizer", *qwen);
  const Conversation conversation = two_turns();
  const nlohmann::json messages = messages_json(conversation.messages);
  auto render = [&](size_t count, bool prompt) {
    return format->render(nlohmann::json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(count)),
                          nlohmann::json::array(), prompt);
  };
  std::vector<TokenizedConversation> examples;
  const auto problem = tokenize_turns(conversation, *format, *qwen, MaskOptions{}, examples);
  ASSERT_FALSE(problem) << *problem;
  ASSERT_EQ(examples.size(), 2u);
  const std::string think = "<think>\n\n</think>\n\n";
  EXPECT_EQ(decoded(*qwen, examples[0], true), think + "A1<|im_end|>\n");
  EXPECT_EQ(decoded(*qwen, examples[1], true), think + "A2<|im_end|>\n");
  EXPECT_EQ(decoded(*qwen, examples[0], false), render(3, false));
  EXPECT_EQ(decoded(*qwen, examples[1], false), render(5, false));
  const std::string history = render(4, true);  // the prompt of the second answer
  EXPECT_NE(history.find("<|im_start|>assistant\nA1<|im_end|>"), std::string::npos) << history;
  EXPECT_EQ(history.find("<think>"), std::string::npos) << "the first answer's block is gone: " << history;
  for (size_t k = 0; k < examples.size(); ++k) {
    const std::string prompt = render(2 * k + 2, true), answer = render(2 * k + 3, false).substr(prompt.size());
    std::vector<int32_t> tokens = qwen->encode(prompt, EncodeOptions{});
    const std::vector<int32_t> answer_tokens = qwen->encode(answer, EncodeOptions{});
    tokens.insert(tokens.end(), answer_tokens.begin(), answer_tokens.end());
    EXPECT_EQ(examples[k].tokens, tokens) << k;
    EXPECT_EQ(examples[k].trained_tokens(), static_cast<int64_t>(answer_tokens.size())) << k;
  }
  // Only the last answer: one example.
  MaskOptions last;
  last.last_turn_only = true;
  ASSERT_FALSE(tokenize_turns(conversation, *format, *qwen, last, examples));
  ASSERT_EQ(examples.size(), 1u);
  EXPECT_EQ(decoded(*qwen, examples[0], true), think + "A2<|im_end|>\n");
}

// A template that is prefix stable gives the same trained text either way: ChatML split into its
// two answers trains each as the whole conversation does.
TEST(ChatMasks, AStableTemplateSplitTrainsTheSameAnswers) {
  const auto byte = make_tokenizer("byte");
  const auto chatml = make_chat_format("chatml", *byte);
  std::vector<TokenizedConversation> examples;
  ASSERT_FALSE(tokenize_turns(two_turns(), *chatml, *byte, MaskOptions{}, examples));
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(trained_text(examples[0]), "A1<|im_end|>\n");
  EXPECT_EQ(trained_text(examples[1]), "A2<|im_end|>\n");
  TokenizedConversation whole;
  ASSERT_FALSE(tokenize_conversation(two_turns(), *chatml, *byte, MaskOptions{}, whole));
  EXPECT_EQ(examples[1].tokens, whole.tokens);  // the last example is the whole conversation
}

// A template that rewrites earlier turns (it numbers them from the end) cannot be attributed.
class Unstable : public ChatFormat {
 public:
  std::string render(const nlohmann::json& messages, const nlohmann::json&, bool) const override {
    std::string text;
    for (size_t i = 0; i < messages.size(); ++i)
      text += std::to_string(messages.size() - i) + messages[i]["content"].get<std::string>();
    return text;
  }
  std::string end_of_turn() const override { return ""; }
  std::string name() const override { return "unstable"; }
};

TEST(ChatMasks, ATemplateThatIsNotPrefixStableIsReported) {
  TokenizedConversation t;
  auto bad = tokenize_conversation(two_turns(), Unstable(), *make_tokenizer("byte"), MaskOptions{}, t);
  ASSERT_TRUE(bad);
  EXPECT_NE(bad->find("not prefix stable at messages[1]"), std::string::npos) << *bad;
}

TEST(Packing, FirstFitDecreasingPlacesEveryDocumentOnceWithinCapacity) {
  const std::vector<int64_t> lengths = {9, 7, 10, 6, 12, 4, 8, 8, 16, 1, 3};
  const auto rows = pack_first_fit_decreasing(lengths, 16);
  std::set<int64_t> seen;
  for (const auto& row : rows) {
    int64_t used = 0;
    for (int64_t d : row) {
      EXPECT_TRUE(seen.insert(d).second) << "document " << d << " placed twice";
      used += lengths[d];
    }
    EXPECT_LE(used, 16);
  }
  EXPECT_EQ(seen.size(), lengths.size());
  // Sorted: 16 | 12 4 | 10 6 | 9 7 | 8 8 | 3 1: six rows, the optimum (84 tokens / 16 > 5).
  EXPECT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0], std::vector<int64_t>({8}));
  EXPECT_EQ(rows[1], std::vector<int64_t>({4, 5}));
  EXPECT_EQ(rows[5], std::vector<int64_t>({10, 9}));
  EXPECT_NEAR(packing_efficiency(rows, lengths, 16), 84.0 / 96.0, 1e-12);
  EXPECT_EQ(one_per_row(lengths, 16).size(), lengths.size());
  EXPECT_THROW(pack_first_fit_decreasing({17}, 16), Error);
  EXPECT_THROW(pack_first_fit_decreasing({0}, 16), Error);
}

TEST(Packing, RowsKeepDocumentsApartWithTheirOwnPositionsAndTargets) {
  TokenizedConversation a{{10, 11, 12}, {0, 1, 1}}, b{{20, 21}, {0, 1}};
  const ChatRows rows = make_rows({a, b}, 8, true, 0);
  ASSERT_EQ(rows.rows, 1);
  EXPECT_EQ(rows.inputs, std::vector<int32_t>({10, 11, 12, 20, 21, 0, 0, 0}));
  EXPECT_EQ(rows.targets, std::vector<int32_t>({11, 12, 0, 21, 0, 0, 0, 0}));
  EXPECT_EQ(rows.loss_weights, std::vector<float>({1, 1, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(rows.documents, std::vector<int32_t>({0, 0, 0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(rows.positions, std::vector<int32_t>({0, 1, 2, 0, 1, 0, 1, 2}));
  EXPECT_EQ(rows.trained_tokens, 3);
  EXPECT_DOUBLE_EQ(rows.efficiency, 5.0 / 8.0);
  EXPECT_EQ(make_rows({a, b}, 8, false, 0).rows, 2);
}

TEST(ChatDataset, OverlongConversationsAreTruncatedOrDroppedAndCounted) {
  const std::string path = write_jsonl("chat-long", "{\"input\":\"short\",\"output\":\"x\"}\n"
                                                    "{\"input\":\"" + std::string(200, 'q') + "\",\"output\":\"y\"}\n");
  ChatDatasetOptions options;
  options.paths = {path};
  options.seq_len = 96;
  const auto byte = make_tokenizer("byte");
  const ChatDataset truncated = build_chat_dataset(options, *byte);
  EXPECT_EQ(truncated.truncated, 1);
  EXPECT_EQ(truncated.dropped_untrained, 1);  // cut inside the prompt: nothing left to train on
  EXPECT_EQ(truncated.train.conversations, 1);
  options.drop_overlong = true;
  const ChatDataset dropped = build_chat_dataset(options, *byte);
  EXPECT_EQ(dropped.dropped_overlong, 1);
  EXPECT_EQ(dropped.truncated, 0);
  fs::remove(path);
}

// sft.split_turns over a file of Qwen 3 conversations: by default (where the template rewrites
// earlier turns) the two-answer conversation becomes two examples and the one-answer one stays
// whole; `never` reports the line as before, naming the key that would train it; `always` splits
// the one-answer conversation too (one example).
TEST(ChatDataset, ConversationsATemplateRewritesAreSplitIntoOneExamplePerAnswer) {
  const std::string path = write_jsonl(
      "chat-split",
      R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},)"
      R"({"role":"assistant","content":"A1"},{"role":"user","content":"Q2"},{"role":"assistant","content":"A2"}]})"
      "\n"
      R"({"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]})"
      "\n");
  const auto qwen = make_tokenizer("hf:" + hf_dir("qwen3"));
  ChatDatasetOptions options;
  options.paths = {path};
  options.chat_template = "tokenizer";
  options.seq_len = 256;
  const ChatDataset split = build_chat_dataset(options, *qwen);
  EXPECT_EQ(split.split_conversations, 1);
  EXPECT_EQ(split.split_examples, 2);
  EXPECT_EQ(split.train.conversations, 3);
  options.split = TurnSplit::Never;
  try {
    build_chat_dataset(options, *qwen);
    ADD_FAILURE() << "a rewritten turn with sft.split_turns=never is an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(":1: chat template"), std::string::npos) << what;
    EXPECT_NE(what.find("not prefix stable at messages[3]"), std::string::npos) << what;
    EXPECT_NE(what.find("sft.split_turns=unstable"), std::string::npos) << what;
  }
  options.split = TurnSplit::Always;
  const ChatDataset always = build_chat_dataset(options, *qwen);
  EXPECT_EQ(always.split_conversations, 2);
  EXPECT_EQ(always.split_examples, 3);
  EXPECT_EQ(always.train.conversations, 3);
  EXPECT_EQ(always.train.trained_tokens, split.train.trained_tokens);
  fs::remove(path);
}

}  // namespace
}  // namespace loom::data
