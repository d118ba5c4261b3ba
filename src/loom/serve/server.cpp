#include "loom/serve/server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/serve/api_error.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/exclusive_port.h"
#include "loom/serve/request_parse.h"
#include "loom/serve/responses.h"

namespace loom::serve {

namespace {
using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// Runs `body`; an ApiError or a loom::Error (bad input the engine found) becomes an OpenAI error.
template <typename F>
void answer(httplib::Response& res, std::atomic<int64_t>& errors, F&& body) {
  try {
    body();
  } catch (const ApiError& e) {
    ++errors;
    send_json(res, e.status, e.body());
  } catch (const Error& e) {
    ++errors;
    // The engine's messages start with the field they are about ("max_tokens: ...").
    const std::string message = e.what();
    const size_t colon = message.find(':');
    const std::string param = colon != std::string::npos && message.find(' ') > colon ? message.substr(0, colon) : "";
    send_json(res, 400, ApiError(400, message, param, "invalid_request_error", "invalid_value").body());
  } catch (const std::exception& e) {
    ++errors;
    send_json(res, 500, ApiError(500, e.what(), "", "server_error").body());
  }
}
}  // namespace

Server::Server(infer::Engine& engine, ServeOptions options)
    : engine_(engine), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  const int threads = options_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  if (!options_.profile_dir.empty()) profile_ = std::make_unique<ops::WindowTrace>(options_.profile_dir, "serve");
  routes();
  profile_routes();
}

Server::~Server() {
  if (engine_thread_.joinable()) {
    engine_.stop(false);
    engine_thread_.join();
  }
}

void Server::routes() {
  httplib::Server& s = *http_;
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req.body, false, &res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req.body, true, &res);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", options_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "loom"},
                  {"max_model_len", engine_.context()}, {"weight_version", engine_.weight_version()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = closing_ ? 503 : 200;
    res.set_content(closing_ ? "shutting down" : "ok", "text/plain");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    answer(res, bad_requests_, [&] {
      const json body = parse_body(req.body);
      std::vector<int32_t> ids;
      if (body.contains("messages")) ids = engine_.tokenizer().encode(render_chat(body["messages"]));
      else if (body.contains("prompt") && body["prompt"].is_string()) ids = engine_.tokenizer().encode(body["prompt"].get<std::string>());
      else throw bad_field("prompt", "a string prompt (or messages) is required");
      send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine_.context()}});
    });
  });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    answer(res, bad_requests_, [&] {
      const json body = parse_body(req.body);
      if (!body.contains("tokens") || !body["tokens"].is_array()) throw bad_field("tokens", "an array of token ids is required");
      std::vector<int32_t> ids;
      for (const json& t : body["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= engine_.sampled_vocab())
          throw bad_field("tokens", "token ids must be integers in [0, " + std::to_string(engine_.sampled_vocab()) + ")");
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      send_json(res, 200, {{"prompt", engine_.tokenizer().decode(ids)}});
    });
  });
  s.Post("/load_weights", [this](const httplib::Request& req, httplib::Response& res) {
    answer(res, bad_requests_, [&] {
      const json body = parse_body(req.body);
      if (!body.contains("path") || !body["path"].is_string()) throw bad_field("path", "a checkpoint directory is required");
      std::string version;
      if (body.contains("version")) {
        if (!body["version"].is_string()) throw bad_field("version", "must be a string");
        version = body["version"].get<std::string>();
      }
      send_json(res, 200, {{"weight_version", engine_.load_weights(body["path"].get<std::string>(), version)}});
    });
  });
  // The digest of the weights being served (as `loom ckpt digest` prints it): what a trainer
  // compares with its own after a refit.
  s.Get("/weights_digest", [this](const httplib::Request&, httplib::Response& res) {
    answer(res, bad_requests_, [&] {
      const auto [digest, version] = engine_.weights_digest();
      send_json(res, 200, {{"digest", digest}, {"weight_version", version}});
    });
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    // cpp-httplib answers 400 to a POST that says nothing of its body's length (curl -X POST
    // without -d): say what to send.
    const bool no_length = req.method == "POST" && !req.has_header("Content-Length") &&
                           !req.has_header("Transfer-Encoding");
    std::string message = "request failed";
    if (res.status == 404) message = "no route " + req.method + " " + req.path;
    if (res.status == 400 && no_length) {
      message = "POST " + req.path + " needs a body with its Content-Length (send {} when there is nothing to say, "
                "e.g. curl -d '{}')";
    }
    send_json(res, res.status, ApiError(res.status, message, "", "invalid_request_error").body());
  });
}

// vLLM's profiling routes: between them the engine's steps are recorded (each step with work,
// its forward and every block's, its sampling: engine_step.cpp), and on a GPU the device's
// profiler runs (Nsight Systems' --capture-range=cudaProfilerApi).
void Server::profile_routes() {
  auto off = [this](httplib::Response& res) {
    if (profile_) return false;
    ++bad_requests_;
    send_json(res, 400,
              ApiError(400, "profiling is off: start loom serve with --profile-dir DIR", "", "invalid_request_error")
                  .body());
    return true;
  };
  http_->Post("/start_profile", [this, off](const httplib::Request&, httplib::Response& res) {
    if (off(res)) return;
    answer(res, bad_requests_, [&] {
      profile_->start();
      kernels::device_profiler_capture(engine_.device(), true);
      send_json(res, 200, {{"profiling", true}});
    });
  });
  http_->Post("/stop_profile", [this, off](const httplib::Request&, httplib::Response& res) {
    if (off(res)) return;
    answer(res, bad_requests_, [&] {
      if (profile_->started()) kernels::device_profiler_capture(engine_.device(), false);
      const ops::WindowTrace::Written written = profile_->stop();
      send_json(res, 200, {{"profiling", false}, {"trace", written.path}, {"ranges", written.ranges}});
    });
  });
}

void Server::run(const std::function<void(int port)>& on_listening) {
  engine_thread_ = std::thread([this] {
    trace::set_thread_sink(profile_.get());  // the engine's ranges (engine_step.cpp), when profiling
    try {
      engine_.run();
    } catch (const std::exception& e) {
      // A model rank failed (or, under mpirun, stopped answering): the engine cannot go on, and
      // requests would wait forever. Fail loudly; the launcher ends the other ranks.
      std::fprintf(stderr, "loom serve: the engine failed, exiting: %s\n", e.what());
      std::fflush(stderr);
      std::_Exit(1);
    }
  });
  listen_exclusively(*http_);
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
  } else if (!http_->bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port < 0) {
    engine_.stop(false);
    engine_thread_.join();
    throw Error("loom serve: cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                " (in use, or not an address of this machine)");
  }
  if (on_listening) on_listening(port);
  http_->listen_after_bind();
  if (engine_thread_.joinable()) engine_thread_.join();
}

void Server::shutdown() {
  if (closing_.exchange(true)) return;
  engine_.stop(true);  // finishes every accepted request
  if (engine_thread_.joinable()) engine_thread_.join();
  // Let the handlers write out what the engine finished.
  for (int i = 0; i < 200 && active_handlers_ > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  http_->stop();
}

std::string Server::metrics_text() const {
  infer::EngineMetrics& m = engine_.metrics();
  std::ostringstream out;
  auto metric = [&](const char* name, const char* type, const char* help, int64_t value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << value << "\n";
  };
  metric("loom_requests_total", "counter", "Requests accepted.", m.requests.load());
  metric("loom_requests_finished_total", "counter", "Requests finished (any reason).", m.requests_finished.load());
  metric("loom_requests_rejected_total", "counter", "Requests answered 429 (queue full) or 503 (shutting down).", rejected_.load());
  metric("loom_requests_invalid_total", "counter", "Requests answered with a 4xx/5xx error object.", bad_requests_.load());
  metric("loom_queue_depth", "gauge", "Requests waiting for the engine.", engine_.queued());
  metric("loom_running_sequences", "gauge", "Samples being generated.", engine_.running());
  metric("loom_kv_blocks_in_use", "gauge", "KV cache blocks held by sequences.", m.kv_blocks_in_use.load());
  metric("loom_kv_blocks_total", "gauge", "KV cache blocks.", m.kv_blocks_total.load());
  metric("loom_mamba_state_slots_in_use", "gauge",
         "State slots held by sequences (hybrid models' Mamba states; drafting depths' kept states).",
         m.state_slots_in_use.load());
  metric("loom_mamba_state_slots_total", "gauge",
         "State slots (one per running sequence; hybrid models, or drafting with several depths).",
         m.state_slots_total.load());
  metric("loom_mamba_state_pool_bytes", "gauge",
         "Bytes of the state pool per rank (Mamba states and their snapshots, drafting depths' states), within the "
         "KV cache budget.",
         m.state_pool_bytes.load());
  metric("loom_prompt_tokens_total", "counter", "Prompt tokens admitted.", m.prompt_tokens.load());
  metric("loom_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV came from a shared prefix.", m.cached_prompt_tokens.load());
  metric("loom_generation_tokens_total", "counter", "Tokens generated.", m.generation_tokens.load());
  metric("loom_engine_steps_total", "counter", "Batched forward steps.", m.steps.load());
  metric("loom_spec_decode_drafts_total", "counter",
         "Verifications of a sample's drafted tokens (speculative decoding).", m.spec_verifications.load());
  metric("loom_spec_decode_draft_tokens_total", "counter", "Tokens drafted and verified.", m.spec_draft_tokens.load());
  metric("loom_spec_decode_accepted_tokens_total", "counter", "Drafted tokens kept.", m.spec_accepted_tokens.load());
  const int drafted_positions = engine_.speculative_tokens();
  if (drafted_positions > 0) {
    const char* name = "loom_spec_decode_accepted_tokens_per_position_total";
    out << "# HELP " << name << " Drafted tokens kept, by their place among a step's drafts (0: the first).\n# TYPE "
        << name << " counter\n";
    for (int j = 0; j < drafted_positions; ++j) {
      out << name << "{position=\"" << j << "\"} " << m.spec_accepted_at[static_cast<size_t>(j)].load() << "\n";
    }
  }
  out << m.time_to_first_token.prometheus("loom_time_to_first_token_seconds", "Time from arrival to the first token.");
  out << m.inter_token_latency.prometheus("loom_inter_token_latency_seconds", "Time between a sample's tokens.");
  return out.str();
}

}  // namespace loom::serve
