#include "loom/rl/controller/resume.h"

#include <filesystem>
#include <fstream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/checkpoint_root.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::rl {

namespace {
std::string progress_path(const std::string& grpo_dir) { return grpo_dir + "/progress.json"; }
}  // namespace

void write_progress(const std::string& grpo_dir, const ControllerProgress& progress) {
  nlohmann::json j = {{"steps_done", progress.steps_done}, {"next_prompt", progress.next_prompt}};
  if (!progress.reported_row.is_null()) j["reported_row"] = progress.reported_row;
  write_file_atomic(progress_path(grpo_dir), j.dump() + "\n");
}

std::optional<ControllerProgress> read_progress(const std::string& grpo_dir) {
  const std::string path = progress_path(grpo_dir);
  if (!std::filesystem::exists(path)) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not JSON (" + e.what() + "); remove it to resume from prompt 0");
  }
  for (const char* key : {"steps_done", "next_prompt"}) {
    LOOM_CHECK(j.is_object() && j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0,
               path + ": \"" + key + "\" must be an integer >= 0; remove the file to resume from prompt 0");
  }
  ControllerProgress progress{j["steps_done"].get<int64_t>(), j["next_prompt"].get<int64_t>(), nullptr};
  if (j.contains("reported_row")) {
    const nlohmann::json& row = j["reported_row"];
    LOOM_CHECK(row.is_object() && row.contains("step") && row["step"] == progress.steps_done,
               path + ": \"reported_row\" must be the metrics row of step steps_done (" +
                   std::to_string(progress.steps_done) + "); remove the key to resume without it");
    progress.reported_row = row;
  }
  return progress;
}

std::optional<ResumePoint> find_resume_point(const config::RunConfig& config, std::ostream& log) {
  // The learner's run directory, as `loom grpo` gives it (local and external alike).
  const std::string root = config.run.dir + "/learner/checkpoints";
  if (!ckpt::read_latest(root)) {
    log << "loom grpo: train.resume: no learner checkpoint under " << root << ", starting from step 0" << std::endl;
    return std::nullopt;
  }
  // The one the learner resumes from: `latest` verified, or the newest good one before it.
  const ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
  if (checkpoint.step() == 0) return std::nullopt;
  ResumePoint point;
  point.step = checkpoint.step();
  point.checkpoint = checkpoint.path();
  const std::optional<ControllerProgress> progress = read_progress(config.run.dir + "/grpo");
  point.next_prompt = progress ? progress->next_prompt : 0;
  // The learner saved the weights of a step it reported, and the run stopped before the row.
  if (progress && !progress->reported_row.is_null() && progress->steps_done + 1 == point.step) {
    point.unwritten_row = progress->reported_row;
    point.unwritten_row["refit_interrupted"] = true;
  }
  log << "loom grpo: train.resume: resuming at step " << point.step << " from " << point.checkpoint << ", prompts from "
      << point.next_prompt << " on"
      << (progress ? "" : " (no " + config.run.dir + "/grpo/progress.json: the prompts drawn before are not known)")
      << std::endl;
  return point;
}

bool has_metrics_row(const std::string& path, int64_t step) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("step") && row["step"] == step) return true;
  }
  return false;
}

void set_aside(const std::string& dir, std::ostream& log) {
  if (!std::filesystem::exists(dir)) return;
  for (int i = 1;; ++i) {
    const std::string to = dir + "." + std::to_string(i);
    if (std::filesystem::exists(to)) continue;
    std::error_code ec;
    std::filesystem::rename(dir, to, ec);
    LOOM_CHECK(!ec, "cannot move the earlier run's '" + dir + "' to '" + to + "' (" + ec.message() + ")");
    log << "loom grpo: the earlier run's " << dir << " is now " << to << std::endl;
    return;
  }
}

}  // namespace loom::rl
