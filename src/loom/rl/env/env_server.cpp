#include "loom/rl/env/env_server.h"

#include <httplib.h>

#include "loom/core/error.h"
#include "loom/serve/api_error.h"
#include "loom/serve/exclusive_port.h"
#include "loom/serve/request_parse.h"
#include "loom/serve/responses.h"

namespace loom::rl {

namespace {
using nlohmann::json;
using serve::ApiError;
using serve::bad_field;

constexpr size_t kMaxSessions = 65536;  // oldest sessions are forgotten beyond this

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(serve::dump(body), "application/json");
}

// Runs `body`; errors become JSON error objects (4xx for the request's fault, 500 otherwise).
template <typename F>
void answer(httplib::Response& res, F&& body) {
  try {
    body();
  } catch (const ApiError& e) {
    send_json(res, e.status, e.body());
  } catch (const Error& e) {
    send_json(res, 400, ApiError(400, e.what()).body());
  } catch (const std::exception& e) {
    send_json(res, 500, ApiError(500, e.what(), "", "server_error").body());
  }
}

json object_body(const std::string& text) {
  json body = serve::parse_body(text);
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object", "");
  return body;
}

int64_t session_field(const json& body) {
  if (!body.contains("session_id")) throw bad_field("session_id", "is required (from /seed_session)");
  const json& id = body["session_id"];
  if (id.is_string()) {
    try {
      size_t used = 0;
      const int64_t value = std::stoll(id.get<std::string>(), &used);
      if (used == id.get<std::string>().size()) return value;
    } catch (const std::exception&) {
    }
  }
  throw bad_field("session_id", "must be a session id string returned by /seed_session");
}

// The final answer: "response", else the content of the last assistant message of "messages".
std::string final_answer(const json& body) {
  if (body.contains("response")) {
    if (!body["response"].is_string()) throw bad_field("response", "must be a string (the final assistant text)");
    return body["response"].get<std::string>();
  }
  if (!body.contains("messages")) throw bad_field("response", "a \"response\" string or a \"messages\" array is required");
  const json& messages = body["messages"];
  if (!messages.is_array()) throw bad_field("messages", "must be an array of messages");
  for (size_t i = messages.size(); i-- > 0;) {
    const json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) throw bad_field(at + ".role", "must be a string");
    if (m["role"] != "assistant") continue;
    if (!m.contains("content") || !(m["content"].is_string() || m["content"].is_null()))
      throw bad_field(at + ".content", "must be a string");
    return m["content"].is_null() ? "" : m["content"].get<std::string>();
  }
  throw bad_field("messages", "holds no assistant message");
}
}  // namespace

EnvironmentServer::EnvironmentServer(std::unique_ptr<Environment> environment, std::string host, int port)
    : environment_(std::move(environment)), host_(std::move(host)), port_(port), http_(std::make_unique<httplib::Server>()) {
  routes();
}

EnvironmentServer::~EnvironmentServer() { stop(); }

void EnvironmentServer::stop() { http_->stop(); }

void EnvironmentServer::run(const std::function<void(int port)>& on_listening) {
  serve::listen_exclusively(*http_);
  const int port = port_ == 0 ? http_->bind_to_any_port(host_) : (http_->bind_to_port(host_, port_) ? port_ : -1);
  if (port < 0) throw Error("loom env serve: cannot listen on " + host_ + ":" + std::to_string(port_) + " (in use, or not an address of this host)");
  if (on_listening) on_listening(port);
  http_->listen_after_bind();
}

void EnvironmentServer::routes() {
  httplib::Server& s = *http_;
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"status", "ok"}, {"environment", environment_->name()}});
  });
  s.Post("/seed_session", [this](const httplib::Request& req, httplib::Response& res) {
    answer(res, [&] {
      const json body = object_body(req.body);
      if (!body.contains("index") || !body["index"].is_number_integer() || body["index"].get<int64_t>() < 0)
        throw bad_field("index", "a prompt index (an integer >= 0) is required");
      const int64_t index = body["index"].get<int64_t>();
      Episode episode = environment_->episode(index);
      json out = {{"index", index}, {"messages", episode.messages}, {"tools", environment_->tools()},
                  {"environment", environment_->name()}};
      std::lock_guard<std::mutex> lock(mutex_);
      const int64_t id = next_session_++;
      sessions_[id] = std::move(episode);
      if (sessions_.size() > kMaxSessions) sessions_.erase(sessions_.begin());
      out["session_id"] = std::to_string(id);
      send_json(res, 200, out);
    });
  });
  s.Post("/verify", [this](const httplib::Request& req, httplib::Response& res) {
    answer(res, [&] {
      const json body = object_body(req.body);
      const int64_t id = session_field(body);
      const std::string answer_text = final_answer(body);
      Episode episode;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = sessions_.find(id);
        if (it == sessions_.end()) throw ApiError(404, "session_id: no session " + std::to_string(id) + " (never seeded, or already verified)", "session_id");
        episode = std::move(it->second);
        sessions_.erase(it);
      }
      const Reward r = environment_->verify(episode.task, answer_text, body.value("messages", json::array()));
      send_json(res, 200, {{"reward", r.reward}, {"components", r.components}});
    });
  });
  // Tools: POST /<tool> with the tool's arguments as the body.
  s.Post(R"(/([A-Za-z_][A-Za-z0-9_]*))", [this](const httplib::Request& req, httplib::Response& res) {
    answer(res, [&] { send_json(res, 200, environment_->call_tool(req.matches[1].str(), object_body(req.body))); });
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message = res.status == 404 ? "no route " + req.method + " " + req.path : "request failed";
    send_json(res, res.status, ApiError(res.status, message).body());
  });
}

}  // namespace loom::rl
