#include "loom/parallel/pipeline/pipeline_partition.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "loom/core/error.h"

namespace loom::parallel {

namespace {

std::vector<int> even_partition(int layers, int stages) {
  std::vector<int> bounds(stages + 1);
  for (int s = 0; s <= stages; ++s) bounds[s] = static_cast<int>(static_cast<int64_t>(layers) * s / stages);
  return bounds;
}

// Minimises the largest stage cost over contiguous splits (dynamic programming over prefixes).
std::vector<int> balanced_partition(const std::vector<double>& costs, double head_cost, int stages) {
  const int layers = static_cast<int>(costs.size());
  std::vector<double> prefix(layers + 1, 0.0);
  for (int l = 0; l < layers; ++l) prefix[l + 1] = prefix[l] + costs[l];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][l]: the smallest possible maximum when the first s stages hold layers [0, l).
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (int l = s; l <= layers - (stages - s); ++l) {
      for (int k = s - 1; k < l; ++k) {
        if (best[s - 1][k] == inf) continue;
        double stage = prefix[l] - prefix[k];
        if (s == stages) stage += head_cost;
        const double worst = std::max(best[s - 1][k], stage);
        if (worst < best[s][l]) {  // strict: ties keep the earliest cut, so the result is deterministic
          best[s][l] = worst;
          cut[s][l] = k;
        }
      }
    }
  }
  std::vector<int> bounds(stages + 1);
  bounds[stages] = layers;
  for (int s = stages; s > 0; --s) bounds[s - 1] = cut[s][bounds[s]];
  return bounds;
}

std::vector<int> explicit_partition(const std::string& spec, int layers, int stages) {
  std::vector<int> counts;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int value = -1;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CHECK(used == item.size() && value >= 1,
          "parallel.pipeline_partition '" + spec + "': '" + item +
              "' is not a layer count >= 1 (valid: even, balanced, or one count per virtual stage such as 2,3,3)");
    counts.push_back(value);
  }
  int total = 0;
  for (int c : counts) total += c;
  LOOM_CHECK(static_cast<int>(counts.size()) == stages && total == layers,
        "parallel.pipeline_partition '" + spec + "' gives " + std::to_string(counts.size()) + " stage(s) holding " +
            std::to_string(total) + " layer(s); the pipeline has " + std::to_string(stages) +
            " virtual stages (pp x virtual_stages) and the model " + std::to_string(layers) + " layers");
  std::vector<int> bounds{0};
  for (int c : counts) bounds.push_back(bounds.back() + c);
  return bounds;
}

}  // namespace

std::vector<int> partition_layers(const std::string& spec, const std::vector<double>& layer_costs, double head_cost,
                                  int stages) {
  const int layers = static_cast<int>(layer_costs.size());
  LOOM_CHECK(stages >= 1, "pipeline partition: " + std::to_string(stages) + " stages (must be >= 1)");
  LOOM_CHECK(layers >= stages, "the pipeline has " + std::to_string(stages) +
                              " virtual stages (parallel.pp x parallel.virtual_stages) but the model only " +
                              std::to_string(layers) + " layers: every stage needs at least one layer");
  if (spec == "even") return even_partition(layers, stages);
  if (spec == "balanced") return balanced_partition(layer_costs, head_cost, stages);
  return explicit_partition(spec, layers, stages);
}

}  // namespace loom::parallel
