#include "loom/parallel/expert/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "loom/parallel/expert/communication.h"

namespace loom::parallel {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

void ExpertParallel::exchange_counts(const int64_t* send, int64_t* recv, int64_t per_peer) {
  const auto start = std::chrono::steady_clock::now();
  exchange_expert_counts(*ep_, send, recv, per_peer);
  counters_.bytes += per_peer * (ep_->size() - 1) * static_cast<int64_t>(sizeof(int64_t));
  counters_.seconds += seconds_since(start);
}

void ExpertParallel::exchange_rows(const float* send, std::span<const int64_t> send_counts, float* recv,
                                   std::span<const int64_t> recv_counts) {
  const auto start = std::chrono::steady_clock::now();
  exchange_expert_rows(*ep_, send, send_counts, recv, recv_counts);
  for (int p = 0; p < ep_->size(); ++p) {
    if (p != ep_->rank()) counters_.bytes += send_counts[p] * static_cast<int64_t>(sizeof(float));
  }
  counters_.seconds += seconds_since(start);
}

ExpertParallel::Counters ExpertParallel::take_counters() {
  const Counters out = counters_;
  counters_ = {};
  return out;
}

void ExpertParallel::sum_over_routing_ranks(float* data, int64_t count) { sum_routing_counts(*routing_, data, count); }

MoeStepSummary finish_moe_step(model::Transformer& model, comm::Communicator& routing, comm::Communicator* pp,
                               ExpertParallel* exchange) {
  double layer_seconds = 0.0;
  // totals: selections, dropped, aux (per micro-batch), z (per micro-batch), loads, (layer, expert) pairs
  std::vector<float> totals(6, 0.0f);
  std::vector<float> extremes = {-std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  for (model::MoeLayer* layer : model.moe_layers()) {
    model::MoeStepStats& stats = layer->step_stats();
    const int E = layer->experts();
    std::vector<float> sums(E + 5);
    for (int e = 0; e < E; ++e) sums[e] = static_cast<float>(stats.loads[e]);
    sums[E] = static_cast<float>(stats.selections);
    sums[E + 1] = static_cast<float>(stats.dropped);
    sums[E + 2] = static_cast<float>(stats.aux_loss);
    sums[E + 3] = static_cast<float>(stats.z_loss);
    sums[E + 4] = static_cast<float>(stats.micro_batches);
    sum_expert_statistics(routing, sums.data(), static_cast<int64_t>(sums.size()));
    const std::vector<double> loads(sums.begin(), sums.begin() + E);
    if (layer->has_expert_bias()) layer->update_bias(loads);
    const float micro_batches = std::max(1.0f, sums[E + 4]);
    totals[0] += sums[E];
    totals[1] += sums[E + 1];
    totals[2] += sums[E + 2] / micro_batches;
    totals[3] += sums[E + 3] / micro_batches;
    totals[4] += sums[E];
    totals[5] += static_cast<float>(E);
    for (int e = 0; e < E; ++e) {
      extremes[0] = std::max(extremes[0], sums[e]);
      extremes[1] = std::max(extremes[1], -sums[e]);
    }
    layer_seconds += stats.seconds;
    stats = model::MoeStepStats{};
    stats.loads.assign(E, 0.0);
  }
  if (pp != nullptr) {
    sum_expert_statistics(*pp, totals.data(), static_cast<int64_t>(totals.size()));
    max_expert_statistics(*pp, extremes.data(), static_cast<int64_t>(extremes.size()));
  }
  MoeStepSummary summary;
  summary.layer_seconds = layer_seconds;
  if (exchange != nullptr) {
    const ExpertParallel::Counters counters = exchange->take_counters();
    summary.exchange_seconds = counters.seconds;
    summary.all_to_all_bytes = counters.bytes;
  }
  summary.any = totals[5] > 0.0f;
  if (!summary.any) return summary;
  summary.tokens_max = extremes[0];
  summary.tokens_min = -extremes[1];
  summary.tokens_mean = totals[4] / totals[5];
  summary.dropped_fraction = totals[0] > 0.0f ? totals[1] / totals[0] : 0.0;
  summary.aux_loss = totals[2];
  summary.z_loss = totals[3];
  return summary;
}

bool is_expert_parameter(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

std::vector<ParameterGroup> expert_parameter_groups(const model::Transformer& model, comm::Communicator& dp,
                                                    comm::Communicator& expert_dp, comm::Communicator& ep,
                                                    int tp_rank) {
  ParameterGroup dense{"dense", {}, &dp};
  ParameterGroup experts{"expert", {}, &expert_dp};
  experts.partitioned_over = &ep;
  experts.norm_counted_here = tp_rank == 0;
  const auto& list = model.params().list();
  for (int id = 0; id < static_cast<int>(list.size()); ++id) {
    (is_expert_parameter(list[id].name) ? experts : dense).params.push_back(id);
  }
  std::vector<ParameterGroup> groups{std::move(dense)};
  if (!experts.params.empty()) groups.push_back(std::move(experts));
  return groups;
}

}  // namespace loom::parallel
