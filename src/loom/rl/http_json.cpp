#include "loom/rl/http_json.h"

#include <httplib.h>

#include <cmath>

namespace loom::rl {

namespace {
using nlohmann::json;

httplib::Client client_for(const std::string& url, double timeout_s) {
  httplib::Client client(url);
  const auto seconds = static_cast<time_t>(std::floor(timeout_s));
  const auto micros = static_cast<time_t>((timeout_s - std::floor(timeout_s)) * 1e6);
  client.set_connection_timeout(seconds, micros);
  client.set_read_timeout(seconds, micros);
  client.set_write_timeout(seconds, micros);
  return client;
}

JsonReply reply_of(const httplib::Result& result, const std::string& what) {
  if (!result) throw HttpFailure(what + " failed: " + httplib::to_string(result.error()));
  JsonReply reply;
  reply.status = result->status;
  reply.body = json::parse(result->body, nullptr, false);
  if (reply.body.is_discarded()) reply.body = nullptr;
  return reply;
}
}  // namespace

std::string JsonReply::error_message() const {
  if (body.is_object() && body.contains("error") && body["error"].is_object() && body["error"].contains("message") &&
      body["error"]["message"].is_string())
    return body["error"]["message"].get<std::string>();
  return "HTTP status " + std::to_string(status);
}

JsonReply post_json(const std::string& url, const std::string& path, const json& body, double timeout_s) {
  httplib::Client client = client_for(url, timeout_s);
  return reply_of(client.Post(path, body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json"),
                  "POST " + url + path);
}

JsonReply get_json(const std::string& url, const std::string& path, double timeout_s) {
  httplib::Client client = client_for(url, timeout_s);
  return reply_of(client.Get(path), "GET " + url + path);
}

std::string get_ok_text(const std::string& url, const std::string& path, double timeout_s) {
  httplib::Client client = client_for(url, timeout_s);
  const httplib::Result result = client.Get(path);
  const std::string what = "GET " + url + path;
  if (!result) throw HttpFailure(what + " failed: " + httplib::to_string(result.error()));
  if (result->status != 200) throw HttpFailure(what + " answered " + std::to_string(result->status));
  return result->body;
}

json post_ok(const std::string& url, const std::string& path, const json& body, double timeout_s) {
  const JsonReply reply = post_json(url, path, body, timeout_s);
  if (reply.status != 200)
    throw HttpFailure("POST " + url + path + " answered " + std::to_string(reply.status) + ": " + reply.error_message());
  return reply.body;
}

}  // namespace loom::rl
