#include "loom/rl/controller/controller.h"

#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/rl/controller/episode_options.h"
#include "loom/rl/controller/resume.h"
#include "loom/rl/controller/validation.h"
#include "loom/rl/http_json.h"
#include "loom/rl/launch/registration.h"
#include "loom/rl/rollout_json.h"
#include "loom/serve/api_error.h"
#include "loom/serve/exclusive_port.h"
#include "loom/serve/request_parse.h"
#include "loom/serve/responses.h"

namespace loom::rl {

namespace {
// How long a metrics row waits for a worker's /metrics (one that does not answer is left out).
constexpr double kDraftMetricsTimeoutS = 10.0;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(serve::dump(body), "application/json");
}

std::string grpo_dir(const config::RunConfig& c) { return c.run.dir + "/grpo"; }
}  // namespace

Controller::Controller(const config::RunConfig& config, ControllerOptions options, std::ostream& log)
    : config_(config), options_(std::move(options)), log_(log),
      buffer_(config.grpo.max_staleness, config.grpo.prompts_per_step), mix_(config.grpo),
      http_(std::make_unique<httplib::Server>()) {
  LOOM_CHECK(!options_.initial_checkpoint.empty(),
             "loom grpo: train.init_from must name the checkpoint the generation workers and the learner start from");
  const std::optional<ResumePoint> resume = config.train.resume ? find_resume_point(config, log) : std::nullopt;
  if (resume) {
    // External roles write their logs there too, as they start: those are the launcher's to keep.
    if (config.grpo.launch == "local") set_aside(grpo_dir(config) + "/logs", log);
    steps_done_ = resume->step;
    next_prompt_ = resume->next_prompt;
    unwritten_row_ = resume->unwritten_row;
  }
  make_directories(grpo_dir(config) + "/logs", "the roles' logs, under run.dir");
  RoleOptions roles;
  roles.loom_binary = options_.loom_binary;
  roles.log_dir = grpo_dir(config) + "/logs";
  roles.checkpoint = resume ? resume->checkpoint : options_.initial_checkpoint;
  roles.version = resume ? resume->step : 0;
  roles.external = config.grpo.launch == "external";
  roles.grpo_dir = grpo_dir(config);
  roles_ = std::make_unique<Roles>(config, roles);
}

Controller::~Controller() {
  stopping_ = true;
  buffer_.close();
  http_->stop();
}

void Controller::request_stop() {
  stopping_ = true;
  buffer_.close();
}

void Controller::write_roles_file(bool finished) {
  json roles = roles_->addresses();
  roles["controller"] = url_;
  if (finished) roles["finished"] = true;  // external roles' supervisors end on it
  std::lock_guard<std::mutex> lock(roles_file_mutex_);  // a step's refit and a role's restart both rewrite it
  write_file_atomic(grpo_dir(config_) + "/roles.json", roles.dump(2) + "\n");
}

void Controller::serve_learner_api() {
  httplib::Server& s = *http_;
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"status", "ok"}, {"steps_done", steps_done_.load()}, {"weight_version", roles_->version()}});
  });
  s.Get("/roles", [this](const httplib::Request&, httplib::Response& res) { send_json(res, 200, roles_->addresses()); });
  s.Get("/batch", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      const std::string text = req.get_param_value("step");
      size_t used = 0;
      int64_t step = -1;
      try {
        step = std::stoll(text, &used);
      } catch (const std::exception&) {
      }
      if (text.empty() || used != text.size() || step < 0)
        throw serve::bad_field("step", "the learner step (an integer >= 0) is required: /batch?step=S");
      send_json(res, 200, batch_for(step));
    } catch (const serve::ApiError& e) {
      send_json(res, e.status, e.body());
    } catch (const Error& e) {
      send_json(res, 503, serve::ApiError(503, e.what(), "", "server_error").body());
    }
  });
  s.Post("/step_done", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      send_json(res, 200, step_done(serve::parse_body(req.body)));
    } catch (const serve::ApiError& e) {
      send_json(res, e.status, e.body());
    } catch (const Error& e) {
      send_json(res, 500, serve::ApiError(500, e.what(), "", "server_error").body());
    }
  });
  // External roles may be on other nodes: listen on every interface, named by the host name.
  const bool external = config_.grpo.launch == "external";
  const std::string host = external ? "0.0.0.0" : "127.0.0.1";
  serve::listen_exclusively(s);
  const int port = options_.port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, options_.port) ? options_.port : -1);
  LOOM_CHECK(port > 0, "loom grpo: the controller cannot listen on port " + std::to_string(options_.port));
  url_ = "http://" + (external ? this_host() : host) + ":" + std::to_string(port);
}

json Controller::batch_for(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(batch_mutex_);
    auto it = batches_.find(step);
    if (it != batches_.end()) return {{"step", step}, {"groups", groups_to_json(it->second.groups)}, {"waited_s", 0.0}, {"again", true}};
  }
  if (step != steps_done_.load())
    throw serve::bad_field("step", "step " + std::to_string(step) + " is not the next one: " + std::to_string(steps_done_.load()) +
                                       " steps are done (POST /step_done after each)");
  TakenBatch batch = buffer_.take(step, config_.grpo.prompts_per_step, config_.grpo.step_timeout_s);
  json out = {{"step", step}, {"groups", groups_to_json(batch.groups)}, {"waited_s", batch.waited_s}};
  std::lock_guard<std::mutex> lock(batch_mutex_);
  batches_[step] = std::move(batch);
  batches_[step].waited_s = out["waited_s"].get<double>();
  taken_at_[step] = Clock::now();
  return out;
}

json Controller::step_done(const json& body) {
  if (!body.is_object() || !body.contains("step") || !body["step"].is_number_integer())
    throw serve::bad_field("step", "the step just trained (an integer) is required");
  if (!body.contains("checkpoint") || !body["checkpoint"].is_string())
    throw serve::bad_field("checkpoint", "the checkpoint holding the new weights (a path) is required");
  const int64_t step = body["step"].get<int64_t>();
  TakenBatch batch;
  LearnerReport learner;
  {
    std::lock_guard<std::mutex> lock(batch_mutex_);
    auto it = batches_.find(step);
    if (it == batches_.end()) throw serve::bad_field("step", "step " + std::to_string(step) + " was not handed out by /batch");
    batch = std::move(it->second);
    batches_.erase(it);
    learner.seconds = std::chrono::duration<double>(Clock::now() - taken_at_[step]).count();
    taken_at_.erase(step);
  }
  if (body.contains("metrics") && body["metrics"].is_object()) learner.metrics = body["metrics"];
  json row = metrics_.row(batch, learner, buffer_.evicted_total(), roles_->restarts(), step + 1);
  // The learner has saved this step's weights: its row is kept before the refit, so that a stop
  // during the refit leaves it to the resumed run (resume.h).
  write_progress(grpo_dir(config_), {step, next_prompt_.load(), row});
  // The refit: in `wait` mode the groups being generated finish on the old weights first.
  const auto refit_start = Clock::now();
  int refit_verified = 0;
  {
    std::unique_lock<std::shared_mutex> hold(refit_lock_, std::defer_lock);
    if (config_.grpo.inflight_updates == "wait") hold.lock();
    try {
      refit_verified = roles_->refit(body["checkpoint"].get<std::string>(), step + 1, body.value("refit", "") == "comm");
    } catch (const Error& e) {  // a worker's weights differ from the learner's: the run stops
      fail_run(e.what());
      throw;
    }
  }
  row["refit_s"] = std::chrono::duration<double>(Clock::now() - refit_start).count();
  if (config_.grpo.verify_refit) row["refit_verified_workers"] = refit_verified;
  if (config_.grpo.worker_speculative_tokens > 0) {
    std::vector<std::string> workers;
    for (size_t i = 0; i < roles_->workers(); ++i) workers.push_back(roles_->worker_url(i));
    row["spec_decode"] = draft_metrics_.since_last(workers, kDraftMetricsTimeoutS);
  }
  const int64_t trained = step + 1;
  if (config_.grpo.validation_prompts > 0 &&
      (trained % config_.grpo.validation_interval == 0 || trained == config_.train.steps)) {
    try {
      row["validation"] = run_validation(trained);
    } catch (const Error& e) {  // not an episode's failure (those are counted): the run's
      fail_run(e.what());
      throw;
    }
  }
  writer_->write(row);
  write_roles_file();
  steps_done_ = step + 1;
  write_progress(grpo_dir(config_), {step + 1, next_prompt_.load(), nullptr});
  {
    std::lock_guard<std::mutex> lock(log_mutex_);
    log_ << "loom grpo: step " << step << " reward " << row["reward_mean"] << " (min " << row["reward_min"] << ", max "
         << row["reward_max"] << "), learner waited " << row["learner_wait_s"] << " s, staleness " << row["staleness"]
         << ", evicted " << row["evicted"] << "; workers now at step-" << step + 1 << std::endl;
  }
  return {{"weight_version", "step-" + std::to_string(step + 1)}};
}

json Controller::run_validation(int64_t weight_version) {
  const json result = validate(config_, *roles_, weight_version, log_).to_json();
  std::ofstream out(config_.run.dir + "/validation.jsonl", std::ios::app);
  out << result.dump() << "\n" << std::flush;
  LOOM_CHECK(out.good(), "loom grpo: cannot append to " + config_.run.dir + "/validation.jsonl");
  return result;
}

std::string Controller::prompt_name(int64_t index, const EnvironmentPrompt& prompt) const {
  const std::string name = "prompt " + std::to_string(index);
  if (config_.grpo.environments.empty()) return name;
  return name + " (" + roles_->environment(prompt.environment).name + "'s task " + std::to_string(prompt.task_index) +
         ")";
}

void Controller::note_filtered_group(const std::string& prompt) {
  const int64_t limit = static_cast<int64_t>(config_.grpo.dynamic_sampling_max_draws) * config_.grpo.prompts_per_step;
  if (++filtered_in_a_row_ < limit) return;
  fail_run("loom grpo: grpo.dynamic_sampling dropped " + std::to_string(limit) + " groups in a row (the last: " +
           prompt + ") whose samples were all rewarded alike; the task is too hard or too easy for the policy: raise "
           "grpo.dynamic_sampling_max_draws (" + std::to_string(config_.grpo.dynamic_sampling_max_draws) +
           " x grpo.prompts_per_step) or turn grpo.dynamic_sampling off");
  buffer_.close();
}

void Controller::fail_run(const std::string& message) {
  std::lock_guard<std::mutex> lock(fatal_mutex_);
  fatal_ = message;
  stopping_ = true;
}

void Controller::rollout_loop(int thread) {
  const config::GrpoConfig& g = config_.grpo;
  while (!stopping_) {
    if (!buffer_.try_reserve(roles_->version())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    const int64_t index = next_prompt_++;
    const EnvironmentPrompt prompt = mix_.at(index);
    const std::string name = prompt_name(index, prompt);
    if (g.validation_prompts > 0 && prompt.task_index >= g.validation_first_index) {
      fail_run("loom grpo: the rollouts reached task index " + std::to_string(prompt.task_index) + " (" + name +
               "), the first held-out prompt (grpo.validation_first_index); raise it above the prompts training uses");
      buffer_.release();
      break;
    }
    bool pushed = false;
    for (int attempt = 0; !stopping_; ++attempt) {
      std::shared_lock<std::shared_mutex> hold(refit_lock_, std::defer_lock);
      if (g.inflight_updates == "wait") hold.lock();
      const AgentOptions o = episode_options(config_, *roles_, static_cast<size_t>(thread + attempt), prompt, attempt);
      try {
        GroupStats stats;
        RolloutGroup group = run_group(o, prompt.task_index, &stats);
        metrics_.group_done(stats);
        if (g.dynamic_sampling && rewarded_alike(group)) {
          metrics_.group_filtered();
          note_filtered_group(name);
          break;  // the slot is released below and the next prompt drawn
        }
        filtered_in_a_row_ = 0;
        buffer_.push(std::move(group));
        pushed = true;
        break;
      } catch (const EpisodeFailure& e) {
        metrics_.episode_failed(e.role);
        roles_->report_failure(e.role, e.role == FailedRole::Environment ? o.environment_url : o.model_url);
        const bool give_up = g.episode_failure == "drop" || attempt >= g.episode_retries;
        {
          std::lock_guard<std::mutex> lock(log_mutex_);
          log_ << "loom grpo: " << name << " failed (attempt " << attempt + 1 << "): " << e.what() << "; "
               << (give_up ? "dropped" : "retrying") << std::endl;
        }
        if (give_up) {
          metrics_.group_dropped();
          break;
        }
      } catch (const std::exception& e) {
        fail_run("rollout of " + name + ": " + e.what());
        break;
      }
      hold = {};
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5000, 250 << std::min(attempt, 4))));
    }
    if (!pushed) buffer_.release();
  }
}

int Controller::run() {
  const int64_t resumed_at = steps_done_.load();  // 0: a fresh run
  writer_ = std::make_unique<config::MetricsWriter>(config_.run.dir, resumed_at, config_.log.tensorboard);
  if (!unwritten_row_.is_null() && !has_metrics_row(writer_->path(), resumed_at - 1)) {
    writer_->write(unwritten_row_);
    log_ << "loom grpo: train.resume: step " << resumed_at - 1
         << "'s metrics row, reported before the stop but not written, written now" << std::endl;
  }
  roles_->start_all(log_);
  serve_learner_api();
  std::thread http_thread([this] {
    listening_ = true;
    http_->listen_after_bind();
  });
  write_roles_file();
  std::vector<std::thread> rollouts;
  std::string failure;
  try {
    const std::string validation = config_.run.dir + "/validation.jsonl";
    if (resumed_at > 0) {
      config::keep_lines_below(validation, "weight_version", resumed_at + 1);  // those of weights saved
    } else if (config_.grpo.validation_prompts > 0) {
      std::error_code ec;
      std::filesystem::remove(validation, ec);
      LOOM_CHECK(!ec, "cannot remove the last run's '" + validation + "' (" + ec.message() + ")");
      run_validation(0);  // the starting weights, before any rollout competes for the workers
    }
    log_ << "loom grpo: controller on " << url_ << "; roles in " << grpo_dir(config_) << "/roles.json" << std::endl;
    for (int t = 0; t < config_.grpo.rollout_thread_count(); ++t) rollouts.emplace_back([this, t] { rollout_loop(t); });
    if (!options_.learner_command.empty())
      learner_ = std::make_unique<ChildProcess>(options_.learner_command, grpo_dir(config_) + "/logs/learner.log");
    while (!stopping_ && steps_done_ < config_.train.steps) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (roles_->check(log_)) write_roles_file();
      if (learner_) {
        if (const auto status = learner_->ended(); status && steps_done_ < config_.train.steps)
          throw Error("loom grpo: the learner " + *status + " after " + std::to_string(steps_done_.load()) + " of " +
                      std::to_string(config_.train.steps) + " steps; its log: " + learner_->log_path());
      }
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const bool interrupted = stopping_ && failure.empty() && steps_done_ < config_.train.steps;
  stopping_ = true;
  buffer_.close();
  for (auto& t : rollouts) t.join();
  if (learner_) {
    // A learner that reported its last step finishes on its own (waits for its saves).
    for (int i = 0; i < 1200 && steps_done_ >= config_.train.steps && !learner_->ended(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    learner_->stop(30.0);
  }
  http_->stop();
  http_thread.join();
  write_roles_file(true);
  roles_->stop_all();
  {
    std::lock_guard<std::mutex> lock(fatal_mutex_);
    if (failure.empty() && !fatal_.empty()) failure = fatal_;
  }
  if (!failure.empty()) throw Error(failure);
  if (interrupted) return 128 + 15;
  log_ << "loom grpo: " << steps_done_.load() << " steps done; metrics in " << config_.run.dir << "/metrics.jsonl" << std::endl;
  return 0;
}

}  // namespace loom::rl
