#pragma once
// JSON over HTTP between the GRPO roles (controller, generation workers, environments): one
// POST or GET with a deadline. A connection failure or a timeout is an HttpFailure (the peer
// is down or stuck: the caller records it and retries, drops or restarts); an HTTP error status
// is returned for the caller to judge.
#include <string>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"

namespace loom::rl {

class HttpFailure : public Error {
 public:
  using Error::Error;
};

struct JsonReply {
  int status = 0;
  nlohmann::json body;  // null when the body is not JSON
  // The error object's message ({"error": {"message"}}), or the raw status.
  std::string error_message() const;
};

// `url`: "http://host:port" (no path); `path`: "/verify". timeout_s bounds connecting, sending
// and reading.
JsonReply post_json(const std::string& url, const std::string& path, const nlohmann::json& body, double timeout_s);
JsonReply get_json(const std::string& url, const std::string& path, double timeout_s);

// The body of a 200 reply; any other status is an HttpFailure naming the peer and the error.
nlohmann::json post_ok(const std::string& url, const std::string& path, const nlohmann::json& body, double timeout_s);
// The text of a 200 reply to a GET (a worker's Prometheus /metrics); else an HttpFailure.
std::string get_ok_text(const std::string& url, const std::string& path, double timeout_s);

}  // namespace loom::rl
