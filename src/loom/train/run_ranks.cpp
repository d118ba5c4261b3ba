#include "loom/train/run_ranks.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>

#include "loom/comm/launch.h"
#include "loom/comm/simulated_links.h"
#include "loom/comm/topology.h"
#include "loom/core/error.h"
#include "loom/train/layout_check.h"

namespace loom::train {

namespace {

// The backend's name, `auto` resolved for this environment.
std::string resolved_backend(const config::RunConfig& config) {
  const config::Backend chosen = config.runtime.backend;
  return chosen == config::Backend::Auto ? comm::detect_backend() : config::to_string(chosen);
}

// topology.simulate: the threads backend delays every inter-rank copy by its link class and
// counts the bytes.
std::shared_ptr<comm::SimulatedLinks> simulated_links(const config::RunConfig& config) {
  if (!config.topology.simulate) return nullptr;
  const std::string backend = resolved_backend(config);
  LOOM_CHECK(backend == "threads", "topology.simulate needs the threads backend (runtime.backend is '" + backend +
                                       "'; real launchers have real links)");
  const config::TopologyConfig& t = config.topology;
  return std::make_shared<comm::SimulatedLinks>(
      comm::topology_from_blocks(config.runtime.ranks, t.ranks_per_node, t.nodes_per_site),
      comm::LinkSpecs{{t.node_latency_us, t.node_bandwidth_gbps},
                      {t.site_latency_us, t.site_bandwidth_gbps},
                      {t.cross_site_latency_us, t.cross_site_bandwidth_gbps}});
}

void check_layout_before_launch(const config::RunConfig& config) {
  // The threads backend knows its world size now: refuse a layout that cannot fit before any
  // rank (thread, communicator, buffers) exists. Launched worlds check it on every rank.
  const std::string backend = resolved_backend(config);
  if (backend == "threads") check_layout(config, config.runtime.ranks);
}

}  // namespace

TrainSummary run_on_ranks(const config::RunConfig& config, std::ostream& out, const RankRecipe& recipe,
                          const std::function<void()>& before_launch) {
  comm::LaunchOptions options;
  options.backend = config::to_string(config.runtime.backend);  // comm/ takes the name
  options.ranks = config.runtime.ranks;
  options.comm.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::llround(config.runtime.timeout_s * 1000.0)));
  check_layout_before_launch(config);
  if (before_launch) before_launch();
  std::shared_ptr<comm::SimulatedLinks> links = simulated_links(config);
  options.link_model = links;
  TrainSummary summary;
  summary.reporter = false;  // set by the rank that reports (in this process, if any)
  std::mutex summary_mutex;
  comm::launch(options, [&](comm::Communicator& world) {
    TrainSummary mine = recipe(world);
    if (mine.reporter) {
      std::lock_guard<std::mutex> lock(summary_mutex);
      summary = mine;
    }
  });
  if (links) out << "simulated links: " << links->describe_traffic() << "\n";
  return summary;
}

namespace {

// The start-up line on what the run evaluates on, when it evaluates (train.skip_train: once,
// without training).
std::string describe_held_out(const config::TrainConfig& train, HeldOutData held_out) {
  const bool only = train.skip_train;
  const bool validating = held_out.validation != nullptr && (only || train.eval_interval > 0);
  if (!validating && held_out.test == nullptr) return "";
  std::string text = std::string(only ? "evaluation only (train.skip_train): " : "evaluation: ") +
                     std::to_string(train.eval_batches) + " micro-batches of ";
  if (validating) {
    text += held_out.validation->describe();
    if (!only) text += " every " + std::to_string(train.eval_interval) + " steps";
  }
  if (held_out.test != nullptr) {
    text += (validating ? ", of " : "") + held_out.test->describe() + (only ? "" : " after the last step");
  }
  return text + "\n";
}

}  // namespace

TrainSummary train_rank(const config::RunConfig& config, comm::Communicator& world, const BatchSource& train,
                        HeldOutData held_out, std::ostream& out) {
  const auto started = std::chrono::steady_clock::now();  // train.exit_duration_mins counts set-up too
  LOOM_CHECK(!config.train.skip_train || held_out.validation != nullptr || held_out.test != nullptr,
             "train.skip_train evaluates the validation and test sets, and this run has neither: name one "
             "(data.val_prefix, data.test_prefix, data.split; sft.val_fraction, sft.val_files, sft.test_files)");
  Trainer trainer(config, world, train, held_out.validation, out);
  trainer.restore();
  trainer.describe();
  trainer.out() << describe_held_out(config.train, held_out);
  if (config.train.skip_train) return evaluate_only(trainer, held_out.test);
  return run_training(trainer, held_out.test, started);
}

}  // namespace loom::train
