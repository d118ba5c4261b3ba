#pragma once
// Cutting the layers of a model into pipeline stages: consecutive layers per virtual stage,
// embedding on the first, output head and loss on the last.
//   even      by count (balanced_first: the later stages take one more when it does not divide)
//   balanced  by cost: the contiguous split that minimises the most expensive stage, with the
//             head's cost on the last stage (heterogeneous layers differ a lot in cost)
//   "a,b,..." explicit layer counts, one per virtual stage, in stage order
#include <string>
#include <vector>

namespace loom::parallel {

// Returns stages + 1 boundaries: virtual stage s holds layers [b[s], b[s + 1]). Every stage holds
// at least one layer; fewer layers than stages, a malformed spec or counts that do not add up are
// Errors naming parallel.pipeline_partition and what would be valid.
// layer_costs[l]: cost of layer l; head_cost: added to the last stage (balanced only).
std::vector<int> partition_layers(const std::string& spec, const std::vector<double>& layer_costs, double head_cost,
                                  int stages);

}  // namespace loom::parallel
