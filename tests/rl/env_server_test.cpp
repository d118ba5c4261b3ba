// The environment servers' endpoints, rewards and malformed requests, over real HTTP.
#include <memory>

#include <gtest/gtest.h>
#include <httplib.h>

#include "loom/data/tasks/task.h"
#include "loom/rl/env/env_server.h"
#include "loom/rl/http_json.h"
#include "rl_test_support.h"

namespace loom::rl {
namespace {
using nlohmann::json;

struct Served {
  explicit Served(const std::string& task, int digits = 2)
      : server(make_environment({task, 1234, digits, 4}), "127.0.0.1", 0),
        thread([this](const std::function<void(int)>& on) { server.run(on); }, [this] { server.stop(); }) {}
  JsonReply post(const std::string& path, const json& body) { return post_json(thread.url(), path, body, 10.0); }
  EnvironmentServer server;
  testing::ServingThread thread;
};

void expect_error(const JsonReply& reply, int status, const std::string& param) {
  EXPECT_EQ(reply.status, status) << reply.body.dump();
  ASSERT_TRUE(reply.body.is_object() && reply.body.contains("error")) << reply.body.dump();
  const json& named = reply.body["error"]["param"];
  EXPECT_EQ(named.is_string() ? named.get<std::string>() : "", param) << reply.body.dump();
}

TEST(EnvServer, ArithmeticSeedsDeterministicTasksAndRewardsExactMatch) {
  Served env("arithmetic");
  const JsonReply health = get_json(env.thread.url(), "/health", 10.0);
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["environment"], "arithmetic");
  const json a = env.post("/seed_session", {{"index", 5}}).body;
  const json b = env.post("/seed_session", {{"index", 5}}).body;
  const json c = env.post("/seed_session", {{"index", 6}}).body;
  const data::SynthTask task = data::make_task("arithmetic", 1234, 5, {2, 4});
  EXPECT_EQ(a["messages"], b["messages"]);
  EXPECT_NE(a["messages"], c["messages"]);
  EXPECT_EQ(a["messages"][0]["content"], task.prompt);
  EXPECT_NE(a["session_id"], b["session_id"]);
  EXPECT_EQ(a["tools"], json::array());
  const JsonReply right = env.post("/verify", {{"session_id", a["session_id"]}, {"response", " " + task.answer + "\n"}});
  EXPECT_EQ(right.status, 200);
  EXPECT_EQ(right.body["reward"], 1.0);
  EXPECT_EQ(right.body["components"]["correct"], 1);
  // The final assistant message of "messages" is the answer when there is no "response".
  const json messages = {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", task.answer + "1"}}};
  const JsonReply wrong = env.post("/verify", {{"session_id", b["session_id"]}, {"messages", messages}});
  EXPECT_EQ(wrong.body["reward"], 0.0);
  // A session is verified once.
  expect_error(env.post("/verify", {{"session_id", a["session_id"]}, {"response", task.answer}}), 404, "session_id");
}

TEST(EnvServer, CountdownRewardsAsTinyZero) {
  Served env("countdown");
  const data::SynthTask task = data::make_task("countdown", 1234, 3, {2, 4});
  auto reward = [&](const std::string& reply) {
    const json seeded = env.post("/seed_session", {{"index", 3}}).body;
    EXPECT_EQ(seeded["messages"][0]["content"], task.prompt);
    return env.post("/verify", {{"session_id", seeded["session_id"]}, {"response", reply}}).body["reward"].get<double>();
  };
  EXPECT_EQ(reward(task.answer), 1.0);
  EXPECT_EQ(reward(task.answer + " = " + std::to_string(task.task["target"].get<int64_t>())), 1.0);
  EXPECT_EQ(reward("1 + 1000"), 0.1);             // well formed, wrong value and numbers
  EXPECT_EQ(reward("(" + task.answer + ") * 1000"), 0.1);
  EXPECT_EQ(reward("the answer is 7"), 0.0);
  EXPECT_EQ(reward(""), 0.0);
  EXPECT_EQ(reward("3 / 0"), 0.0);                // not an exact value
}

TEST(EnvServer, CalculatorToolEvaluatesSafely) {
  Served env("calculator", 3);
  const json seeded = env.post("/seed_session", {{"index", 0}}).body;
  EXPECT_EQ(seeded["messages"][0]["role"], "system");
  EXPECT_EQ(seeded["tools"][0]["function"]["name"], "calculator");
  const JsonReply value = env.post("/calculator", {{"expression", "12 * (3 + 4) - 10 / 5"}});
  EXPECT_EQ(value.status, 200);
  EXPECT_EQ(value.body["result"], 82);
  const JsonReply bad = env.post("/calculator", {{"expression", "1 / 0; rm -rf /"}});
  EXPECT_EQ(bad.status, 200);
  EXPECT_TRUE(bad.body["result"].is_null());
  EXPECT_NE(bad.body["error"].get<std::string>().find("cannot evaluate"), std::string::npos);
  expect_error(env.post("/calculator", {{"expr", "1"}}), 400, "expression");
  expect_error(env.post("/calculator", {{"expression", 5}}), 400, "expression");
  expect_error(env.post("/search", {{"q", "x"}}), 404, "tool");
  // The reward counts the tool calls of the episode.
  const data::SynthTask task = data::make_task("arithmetic", 1234, 0, {3, 4});
  const json messages = {seeded["messages"][0], seeded["messages"][1], {{"role", "assistant"}, {"content", "<tool_call>{}</tool_call>"}},
                         {{"role", "tool"}, {"content", "{\"result\": 1}"}}, {{"role", "assistant"}, {"content", task.answer}}};
  const JsonReply verdict = env.post("/verify", {{"session_id", seeded["session_id"]}, {"messages", messages}});
  EXPECT_EQ(verdict.body["reward"], 1.0);
  EXPECT_EQ(verdict.body["components"]["tool_calls"], 1);
}

TEST(EnvServer, MalformedRequestsNameTheField) {
  Served env("arithmetic");
  expect_error(env.post("/seed_session", json::array()), 400, "");
  expect_error(env.post("/seed_session", json::object()), 400, "index");
  expect_error(env.post("/seed_session", {{"index", -1}}), 400, "index");
  expect_error(env.post("/seed_session", {{"index", "3"}}), 400, "index");
  expect_error(env.post("/verify", {{"response", "1"}}), 400, "session_id");
  expect_error(env.post("/verify", {{"session_id", 7}, {"response", "1"}}), 400, "session_id");
  expect_error(env.post("/verify", {{"session_id", "999"}, {"response", "1"}}), 404, "session_id");
  const json seeded = env.post("/seed_session", {{"index", 1}}).body;
  expect_error(env.post("/verify", {{"session_id", seeded["session_id"]}}), 400, "response");
  expect_error(env.post("/verify", {{"session_id", seeded["session_id"]}, {"response", 12}}), 400, "response");
  expect_error(env.post("/verify", {{"session_id", seeded["session_id"]}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}), 400, "messages");
  expect_error(env.post("/verify", {{"session_id", seeded["session_id"]}, {"messages", {{{"content", "x"}}}}}), 400, "messages[0].role");
  // Not JSON at all.
  httplib::Client client(env.thread.url());
  const auto broken = client.Post("/seed_session", "{\"index\": ", "application/json");
  ASSERT_TRUE(broken);
  EXPECT_EQ(broken->status, 400);
  EXPECT_NE(broken->body.find("error"), std::string::npos);
  const JsonReply raw = get_json(env.thread.url(), "/nowhere", 10.0);
  EXPECT_EQ(raw.status, 404);
  EXPECT_TRUE(raw.body.contains("error"));
  // The session survives bad verify calls and still verifies.
  EXPECT_EQ(env.post("/verify", {{"session_id", seeded["session_id"]}, {"response", "x"}}).status, 200);
}

TEST(EnvServer, UnknownTaskIsAnErrorListingTheValidOnes) {
  try {
    make_environment({"chess", 1, 2, 4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arithmetic, countdown, calculator"), std::string::npos);
  }
}

// A port another server listens on is refused, naming it (cpp-httplib's default SO_REUSEPORT
// would have let the second server share it and take half its connections); two plain httplib
// servers show that default.
TEST(EnvServer, APortInUseIsRefused) {
  Served first("arithmetic");
  const int port = std::stoi(first.thread.url().substr(first.thread.url().rfind(':') + 1));
  EnvironmentServer second(make_environment({"arithmetic", 1234, 2, 4}), "127.0.0.1", port);
  try {
    second.run([](int) { throw Error("the second server listens"); });  // leaves run() before it serves
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(port) + " (in use"), std::string::npos)
        << e.what();
  }
  httplib::Server plain, plain_twin;
  const int shared = plain.bind_to_any_port("127.0.0.1");
  EXPECT_TRUE(plain_twin.bind_to_port("127.0.0.1", shared)) << "cpp-httplib no longer shares ports by default";
  EXPECT_EQ(post_json(first.thread.url(), "/seed_session", {{"index", 1}}, 10.0).status, 200);
}

}  // namespace
}  // namespace loom::rl
