#include "loom/plan/search.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/core/error.h"

namespace loom::plan {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// Every layout of one mesh (tp x cp x pp x dp ranks, ep of them sharing the experts, v virtual
// stages): ZeRO stage, micro-batch size, recompute and sequence parallelism, into `out`.
void add_options(const config::RunConfig& base, comm::MeshShape mesh, int v, std::vector<config::RunConfig>& out) {
  for (int zero = 0; zero <= 3; ++zero) {
    if (mesh.dp * mesh.cp == 1 && zero > 0) continue;  // one replica of the gradients: nothing to shard
    for (int mb : divisors(base.train.global_batch / mesh.dp)) {
      for (int recompute = 0; recompute <= 1; ++recompute) {
        for (int sp = 0; sp <= (mesh.tp > 1 ? 1 : 0); ++sp) {
          config::RunConfig c = base;
          c.parallel.tp = mesh.tp;
          c.parallel.cp = mesh.cp;
          c.parallel.ep = mesh.ep;
          c.parallel.pp = mesh.pp;
          c.parallel.dp = config::AutoCount{mesh.dp};
          c.parallel.virtual_stages = v;
          c.parallel.pipeline_schedule =
              v > 1 ? config::PipelineScheduleKind::Interleaved : config::PipelineScheduleKind::OneFOneB;
          c.parallel.zero = zero;
          // The update's gathers overlap the forward at ZeRO 1-2 only (ZeRO 0 and 3 refuse the key).
          c.parallel.overlap_param_gather = base.parallel.overlap_param_gather && (zero == 1 || zero == 2);
          c.parallel.sequence_parallel = sp == 1;
          c.train.micro_batch = mb;
          c.model.recompute = recompute == 1;
          // With ZeRO-3's shards on the host, with and without the device's copy of them for the
          // gathers: it costs memory a larger micro-batch may want and saves link time.
          if (base.parallel.offload_params && zero == 3) {
            config::RunConfig copied = c;
            copied.parallel.offload_params_device_copy = !base.parallel.offload_params_device_copy;
            out.push_back(std::move(copied));
          }
          out.push_back(std::move(c));
        }
      }
    }
  }
}

// Every layout of tp x cp x pp x dp ranks: expert parallelism (a divisor of tp x cp x dp and of
// the experts), virtual stages and add_options's, into `out`.
void add_layouts(const config::RunConfig& base, int tp, int cp, int pp, int dp, std::vector<config::RunConfig>& out) {
  if (base.train.global_batch % dp != 0) return;
  std::vector<int> virtuals = {1};
  if (pp > 1) {
    for (int v = 2; v * pp <= base.model.layers && v <= 4; ++v) virtuals.push_back(v);
  }
  for (int ep : divisors(tp * cp * dp)) {
    if (ep > 1 && (base.model.moe.experts == 0 || base.model.moe.experts % ep != 0)) continue;
    for (int v : virtuals) add_options(base, {.tp = tp, .cp = cp, .ep = ep, .dp = dp, .pp = pp}, v, out);
  }
}

// Every combination of the layout keys, before any rule is applied.
std::vector<config::RunConfig> enumerate(const config::RunConfig& base, int devices) {
  std::vector<config::RunConfig> out;
  for (int tp : divisors(devices)) {
    for (int cp : divisors(devices / tp)) {
      if (base.data.seq_len % (2 * cp) != 0) continue;  // each cp rank takes 2 of a sequence's 2 x cp chunks
      for (int pp : divisors(devices / (tp * cp))) add_layouts(base, tp, cp, pp, devices / (tp * cp * pp), out);
    }
  }
  return out;
}

}  // namespace

std::string Candidate::describe() const {
  std::ostringstream o;
  const config::ParallelConfig& p = config.parallel;
  o << "tp " << p.tp << (p.sequence_parallel ? "+sp" : "");
  if (p.cp > 1) o << ", cp " << p.cp << " (" << p.cp_comm << ")";
  if (p.ep > 1) o << ", ep " << p.ep;
  o << ", pp " << p.pp;
  if (p.virtual_stages > 1) o << "x" << p.virtual_stages;
  o << ", dp " << memory.layout.shape.dp << ", zero " << p.zero << ", micro-batch " << config.train.micro_batch
    << (config.model.recompute ? ", recompute" : "");
  if (p.offload_params) {
    o << (p.offload_params_device_copy ? ", shards on the host, a copy on the device" : ", shards on the host");
  }
  return o.str();
}

std::vector<std::string> Candidate::overrides() const {
  const config::ParallelConfig& p = config.parallel;
  std::vector<std::string> o = {"parallel.tp=" + std::to_string(p.tp), "parallel.cp=" + std::to_string(p.cp),
                                "parallel.pp=" + std::to_string(p.pp),
                                "parallel.zero=" + std::to_string(p.zero),
                                "train.micro_batch=" + std::to_string(config.train.micro_batch),
                                std::string("model.recompute=") + (config.model.recompute ? "true" : "false")};
  if (p.sequence_parallel) o.push_back("parallel.sequence_parallel=true");
  if (p.ep > 1) o.push_back("parallel.ep=" + std::to_string(p.ep));
  if (p.virtual_stages > 1) {
    o.push_back("parallel.pipeline_schedule=interleaved");
    o.push_back("parallel.virtual_stages=" + std::to_string(p.virtual_stages));
  }
  if (overlap_dropped) o.push_back("parallel.overlap_param_gather=false");
  if (p.offload_params) {
    o.push_back(std::string("parallel.offload_params_device_copy=") +
                (p.offload_params_device_copy ? "true" : "false"));
  }
  return o;
}

SearchResult search_layouts(const config::RunConfig& base, const Hardware& hardware, int devices,
                            const LayoutCheck& check, const MemoryOptions& options) {
  LOOM_CHECK(devices >= 1, "--devices must be at least 1 (got " + std::to_string(devices) + ")");
  SearchResult result;
  // Every candidate plans on base's model (the search changes only model.recompute among its keys).
  StageParameterLists lists;
  MemoryOptions planned = options;
  planned.parameter_lists = &lists;
  for (config::RunConfig& c : enumerate(base, devices)) {
    ++result.enumerated;
    Candidate candidate;
    candidate.overlap_dropped = base.parallel.overlap_param_gather && !c.parallel.overlap_param_gather;
    try {
      config::validate_config(c);
      const comm::MeshShape shape = check(c, devices);
      candidate.memory = plan_memory(c, shape, planned);
    } catch (const Error& e) {
      ++result.refused;  // a rule of the run, the schedule, the model's splits or the device refuses it
      if (result.first_refusal.empty()) {
        candidate.config = c;
        for (const std::string& o : candidate.overrides()) result.first_refusal += o + " ";
        result.first_refusal += std::string("(") + e.what() + ")";
      }
      continue;
    }
    if (static_cast<double>(candidate.memory.peak()) > hardware.memory_bytes) {
      ++result.too_large;
      continue;
    }
    candidate.time = plan_time(c, candidate.memory, hardware);
    candidate.config = std::move(c);
    result.ranked.push_back(std::move(candidate));
  }
  // Planned times within about 2% are equal for the model: among them prefer fewer, larger
  // micro-batches (per-micro-batch and per-kernel costs are not in the model; larger GEMMs are
  // never slower), then sequence parallelism (less activation memory), then the planned time.
  auto band = [](const Candidate& c) { return static_cast<int64_t>(std::floor(std::log(c.time.step) / std::log(1.02))); };
  std::stable_sort(result.ranked.begin(), result.ranked.end(), [&](const Candidate& a, const Candidate& b) {
    if (band(a) != band(b)) return band(a) < band(b);
    if (a.config.train.micro_batch != b.config.train.micro_batch) return a.config.train.micro_batch > b.config.train.micro_batch;
    if (a.config.parallel.sequence_parallel != b.config.parallel.sequence_parallel) return a.config.parallel.sequence_parallel;
    return a.time.step < b.time.step;
  });
  return result;
}

}  // namespace loom::plan
