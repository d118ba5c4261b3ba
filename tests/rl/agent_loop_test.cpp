// The agent loop against a real loom serve (a tiny trained checkpoint) and an environment
// server: the rollout's tokens are the server's prompt and sampled ids, its log-probabilities
// those of a full forward of the model; multi-turn tool use against a scripted chat server.
#include <cmath>
#include <regex>

#include <gtest/gtest.h>
#include <httplib.h>

#include "../train/training_runs.h"
#include "loom/data/tasks/task.h"
#include "loom/kernels/types.h"
#include "loom/rl/agent_loop.h"
#include "loom/rl/env/env_server.h"
#include "loom/rl/http_json.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/server.h"
#include "loom/train/model_setup.h"
#include "rl_test_support.h"

namespace loom::rl {
namespace {
using nlohmann::json;

std::string tiny_checkpoint() {
  static const std::string made = [] {
    const std::string root = train::testing::make_training_root("rl-agent");
    const std::string yaml =
        "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu,\n"
        "        positions: rope, tied_embeddings: false, max_seq_len: 128}\n"
        "optim: {lr: 3.0e-3}\ntrain: {steps: 2, global_batch: 4, micro_batch: 4, seed: 7}\n" +
        train::testing::data_section(root);
    train::testing::train_run(root, "tiny", yaml, {});
    return root + "/tiny/checkpoints";
  }();
  return made;
}

// log p(tokens[i] | tokens[:i]) from one fp32 forward of the checkpoint's model.
double forward_logprob(model::Transformer& model, const std::vector<int32_t>& tokens, size_t i) {
  std::vector<int32_t> inputs(tokens.begin(), tokens.begin() + static_cast<long>(i));
  std::vector<int32_t> targets(inputs.size(), kernels::kIgnoreIndex);
  targets.back() = tokens[i];
  return -model.forward_loss(inputs.data(), targets.data(), 1, static_cast<int64_t>(inputs.size()));
}

struct Environment {
  explicit Environment(const std::string& task)
      : server(make_environment({task, 99, 1, 4}), "127.0.0.1", 0),
        thread([this](const std::function<void(int)>& on) { server.run(on); }, [this] { server.stop(); }) {}
  EnvironmentServer server;
  testing::ServingThread thread;
};

TEST(AgentLoop, SingleTurnGroupHoldsTheServersTokensAndLogprobs) {
  const std::string checkpoint = tiny_checkpoint();
  infer::Engine engine(checkpoint, {});
  serve::ServeOptions serve_options;
  serve_options.port = 0;
  serve::Server model_server(engine, serve_options);
  testing::ServingThread model_thread([&](const std::function<void(int)>& on) { model_server.run(on); },
                                      [&] { model_server.shutdown(); });
  Environment env("arithmetic");
  AgentOptions o;
  o.model_url = model_thread.url();
  o.environment_url = env.thread.url();
  o.samples = 3;
  o.max_tokens = 6;
  o.seed = 11;
  GroupStats stats;
  const RolloutGroup group = run_group(o, 7, &stats);
  EXPECT_EQ(group.prompt_index, 7);
  EXPECT_EQ(group.weight_version, 2);  // the checkpoint of step 2, "step-2"
  ASSERT_EQ(group.samples.size(), 3u);

  // The prompt is the server's tokenization of the seeded messages.
  const json seeded = post_ok(env.thread.url(), "/seed_session", {{"index", 7}}, 10.0);
  const auto prompt = post_ok(model_thread.url(), "/tokenize", {{"messages", seeded["messages"]}}, 10.0)["tokens"].get<std::vector<int32_t>>();
  ckpt::LoadedCheckpoint loaded = ckpt::load_checkpoint(checkpoint);
  config::RunConfig config = config::parse_config(loaded.config_yaml(), "manifest", {});
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  model::Transformer model(train::resolve_model_config(config.model, *tokenizer));
  train::load_parameters(loaded, model);
  int64_t generated = 0;
  bool differ = false;
  for (const Rollout& r : group.samples) {
    EXPECT_EQ(r.environment, "arithmetic");
    ASSERT_GT(r.tokens.size(), prompt.size());
    ASSERT_EQ(r.trained.size(), r.tokens.size());
    ASSERT_EQ(r.generation_logprobs.size(), r.tokens.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), r.tokens.begin()));
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      EXPECT_EQ(r.trained[i], i >= prompt.size() ? 1 : 0) << i;
      if (!r.trained[i]) {
        EXPECT_EQ(r.generation_logprobs[i], 0.0f);
        continue;
      }
      ++generated;
      EXPECT_NEAR(r.generation_logprobs[i], forward_logprob(model, r.tokens, i), 1e-4) << "token " << i;
    }
    EXPECT_LE(r.tokens.size() - prompt.size(), 6u);
    EXPECT_TRUE(r.reward == 0.0 || r.reward == 1.0);
    EXPECT_EQ(r.truncated, r.tokens.size() - prompt.size() == 6u);
    differ = differ || r.tokens != group.samples[0].tokens;
  }
  EXPECT_TRUE(differ) << "the n samples of a group are sampled independently";
  EXPECT_EQ(stats.generated_tokens, generated);

  // A dead environment is an environment failure; a dead worker a generation failure.
  AgentOptions no_env = o;
  no_env.environment_url = "http://127.0.0.1:1";
  no_env.environment_timeout_s = 2.0;
  try {
    run_group(no_env, 1);
    FAIL();
  } catch (const EpisodeFailure& e) {
    EXPECT_EQ(e.role, FailedRole::Environment) << e.what();
  }
  AgentOptions no_model = o;
  no_model.model_url = "http://127.0.0.1:1";
  no_model.generation_timeout_s = 2.0;
  try {
    run_group(no_model, 1);
    FAIL();
  } catch (const EpisodeFailure& e) {
    EXPECT_EQ(e.role, FailedRole::Generation) << e.what();
  }
}

// A chat server that calls the calculator on the user's question, then answers with the tool's
// result: prompt ids are the bytes of the ChatML rendering, as loom's byte tokenizer makes them.
class ScriptedChat {
 public:
  ScriptedChat()
      : thread([this](const std::function<void(int)>& on) { run(on); }, [this] { http.stop(); }) {}
  void run(const std::function<void(int)>& on) {
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const json body = json::parse(req.body);
      const json& messages = body["messages"];
      const std::string prompt = serve::render_chat(messages);
      std::string content;
      if (messages.back()["role"] == "tool") {
        content = std::to_string(json::parse(messages.back()["content"].get<std::string>())["result"].get<int64_t>());
      } else {
        std::smatch m;
        const std::string question = messages.back()["content"].get<std::string>();
        std::regex_search(question, m, std::regex("What is (.*)\\?"));
        content = "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" + m[1].str() + "\"}}</tool_call>";
      }
      const std::string sampled = content + serve::chat_end_of_turn();
      json ids = json::array(), logprobs = json::array();
      for (unsigned char c : sampled) {
        ids.push_back(static_cast<int>(c));
        logprobs.push_back({{"token", std::string(1, static_cast<char>(c))}, {"logprob", -0.25}});
      }
      json prompt_ids = json::array();
      for (unsigned char c : prompt) prompt_ids.push_back(static_cast<int>(c));
      const json reply = {{"weight_version", "step-" + std::to_string(5 - calls++)},
                          {"prompt_token_ids", prompt_ids},
                          {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}},
                                        {"token_ids", ids}, {"logprobs", {{"content", logprobs}}}, {"finish_reason", "stop"}}}}};
      res.set_content(reply.dump(), "application/json");
    });
    const int port = http.bind_to_any_port("127.0.0.1");
    on(port);
    http.listen_after_bind();
  }
  httplib::Server http;
  std::atomic<int> calls{0};
  testing::ServingThread thread;
};

TEST(AgentLoop, MultiTurnEpisodeCallsTheToolAndTrainsOnlyTheModelsTurns) {
  Environment env("calculator");
  ScriptedChat chat;
  AgentOptions o;
  o.model_url = chat.thread.url();
  o.environment_url = env.thread.url();
  o.samples = 1;
  o.max_turns = 3;
  GroupStats stats;
  const RolloutGroup group = run_group(o, 4, &stats);
  ASSERT_EQ(group.samples.size(), 1u);
  const Rollout& r = group.samples[0];
  EXPECT_EQ(r.reward, 1.0) << "the calculator's result is the right answer";
  EXPECT_EQ(stats.tool_calls, 1);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(group.weight_version, 4) << "the oldest version of the episode's turns (step-5, then step-4)";
  // The whole episode is the ChatML rendering of the conversation, token for byte.
  const json seeded = post_ok(env.thread.url(), "/seed_session", {{"index", 4}}, 10.0);
  const data::SynthTask task = data::make_task("arithmetic", 99, 4, {1, 4});
  std::string text = serve::render_chat(seeded["messages"]);
  const size_t first_turn = text.size();
  std::string call_text;
  for (size_t i = first_turn; i < r.tokens.size() && r.trained[i]; ++i) call_text += static_cast<char>(r.tokens[i]);
  EXPECT_NE(call_text.find("<tool_call>"), std::string::npos) << call_text;
  std::string all;
  for (int32_t t : r.tokens) all += static_cast<char>(t);
  EXPECT_EQ(all.substr(0, first_turn), text);
  EXPECT_TRUE(all.ends_with(task.answer + "<|im_end|>")) << all;
  // Trained: exactly the two assistant turns (the call and the answer, each with its end of turn).
  std::string trained;
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (r.trained[i]) trained += static_cast<char>(r.tokens[i]);
    EXPECT_EQ(r.generation_logprobs[i], r.trained[i] ? -0.25f : 0.0f);
  }
  EXPECT_EQ(trained, call_text + task.answer + "<|im_end|>");
  EXPECT_NE(all.find("<|im_start|>tool\n{\"result\":"), std::string::npos) << all;

  // With one turn allowed, a tool call ends the episode truncated and unrewarded.
  o.max_turns = 1;
  const RolloutGroup cut = run_group(o, 4);
  EXPECT_TRUE(cut.samples[0].truncated);
  EXPECT_EQ(cut.samples[0].reward, 0.0);
}

TEST(AgentLoop, WeightVersionsParse) {
  EXPECT_EQ(parse_weight_version("step-12"), 12);
  EXPECT_EQ(parse_weight_version("3"), 3);
  EXPECT_THROW(parse_weight_version("v7"), Error);
  EXPECT_THROW(parse_weight_version("step-"), Error);
}

// An episode of one of the run's environments (grpo.environments) checks that its server serves
// that environment's task: a server of another task is the run's error, not a failed episode
// (a restart would not mend it); with the right task the episode goes on to the worker.
TEST(AgentLoop, AServerOfAnotherTaskIsTheRunsError) {
  Environment env("arithmetic");
  AgentOptions o;
  o.model_url = "http://127.0.0.1:1";  // no worker: an episode that reaches it fails as the worker's
  o.environment_url = env.thread.url();
  o.environment_name = "sums";
  o.environment_task = "countdown";
  o.samples = 2;
  o.generation_timeout_s = 5;
  try {
    run_group(o, 3);
    ADD_FAILURE() << "a countdown episode ran on an arithmetic server";
  } catch (const EpisodeFailure& e) {
    ADD_FAILURE() << "taken for a failed episode: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("serves 'arithmetic', and this episode is of environment 'sums' (task 'countdown')"),
              std::string::npos)
        << e.what();
  }
  o.environment_task = "arithmetic";
  try {
    run_group(o, 3);
    ADD_FAILURE() << "no worker answers";
  } catch (const EpisodeFailure& e) {
    EXPECT_EQ(e.role, FailedRole::Generation) << e.what();
  }
}

}  // namespace
}  // namespace loom::rl
