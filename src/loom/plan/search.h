#pragma once
// `loom plan search`: every layout of a run on N devices (tp, pp, virtual stages, dp, ZeRO stage,
// micro-batch size, recompute, sequence parallelism), the ones the run's rules refuse left out,
// those that do not fit the device's memory dropped, the rest ranked by planned step time (times
// within about 2% count as equal: then larger micro-batches, then sequence parallelism first).
// Context parallelism (parallel.cp) is enumerated too, with the config's parallel.cp_comm; expert
// parallelism (parallel.ep) is not: it stays as the config sets it. With parallel.offload_params,
// ZeRO-3 layouts with and without parallel.offload_params_device_copy.
#include <functional>
#include <string>
#include <vector>

#include "loom/comm/mesh.h"
#include "loom/config/run_config.h"
#include "loom/plan/hardware.h"
#include "loom/plan/memory_plan.h"
#include "loom/plan/time_plan.h"

namespace loom::plan {

struct Candidate {
  config::RunConfig config;  // the base config with this layout's keys set
  MemoryPlan memory;
  TimeBreakdown time;
  std::string describe() const;  // "tp 2 pp 1 dp 2 zero 1 mb 4 recompute off ..."
  std::vector<std::string> overrides() const;  // "parallel.tp=2", ... to run it with loom train
  // The base asked for parallel.overlap_param_gather, which this layout's ZeRO stage (0 or 3)
  // refuses: its overrides set it false.
  bool overlap_dropped = false;
};

struct SearchResult {
  std::vector<Candidate> ranked;  // fitting layouts, fastest first
  int enumerated = 0, refused = 0, too_large = 0;
  std::string first_refusal;  // why the first refused layout was (the report shows it when none ranks)
};

// The run's layout rules: the mesh shape of `config` on `devices` ranks, or a loom::Error
// (train::check_layout; given by the caller, which links the trainer).
using LayoutCheck = std::function<comm::MeshShape(const config::RunConfig& config, int devices)>;

SearchResult search_layouts(const config::RunConfig& base, const Hardware& hardware, int devices,
                            const LayoutCheck& check, const MemoryOptions& options = {});

}  // namespace loom::plan
