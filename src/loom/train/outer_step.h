#pragma once
// DiLoCo in the trainer (parallel.outer=diloco): the data-parallel group is cut into its sites
// (parallel.dp_sites, or the topology), the gradient synchronisation runs over the site's ranks
// only, and after each step parallel::DilocoOuter syncs the fragments due across sites.
//
// Checkpoints: each site's parameters and inner moments differ between syncs, so site 0 writes
// the usual tensors (a plain checkpoint of its model) and site k > 0 writes the same slices under
// `optim.site<k>_value.<param>` and `optim.site<k>_<slot>.<param>`; the outer state (the same on
// every site) is `optim.outer_anchor.<param>` and `optim.outer_momentum.<param>`, written by site
// 0. All are global tensors by parameter, so a resume is bitwise at the same layout.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/diloco.h"
#include "loom/parallel/data/parameter_ranges.h"
#include "loom/parallel/data/site_groups.h"

namespace loom::train {

class OuterStep {
 public:
  // Null unless parallel.outer=diloco; collective over `dp` otherwise. Throws naming the keys
  // when the layout cannot train that way.
  static std::unique_ptr<OuterStep> make(const config::RunConfig& config, comm::Communicator& dp);

  // The ranks of this site: the inner data-parallel group.
  comm::Communicator& inner_group() { return *groups_->in_site; }
  // Once the model holds its initial parameters.
  void attach(model::Transformer& model);
  // After the inner step `step`: whether the outer step replaced the parameters. Collective.
  bool after_step(int64_t step);
  // Whether after_step(step) reads and replaces parameters.
  bool syncs_at(int64_t step) const { return outer_->syncs_at(step); }
  // Bytes this rank sent across sites since the last call.
  int64_t take_cross_site_bytes();

  // This rank's tensors of a checkpoint, from the inner state's refs and owned ranges.
  std::vector<ckpt::TensorRef> checkpoint_tensors(const model::Transformer& model, std::vector<ckpt::TensorRef> inner,
                                                  const std::vector<parallel::OwnedRange>& owned) const;
  // After load_training_checkpoint: this site's parameters and moments and the outer state
  // (none in the checkpoint: the outer step starts from the loaded parameters).
  void restore(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model, float* exp_avg,
               float* exp_avg_sq);

 private:
  OuterStep(const config::RunConfig& config, std::unique_ptr<parallel::SiteGroups> groups);
  std::string site_name(const std::string& name) const;
  // read_parameter_state into `out` on the parameters' device (through the host on a GPU).
  void read_state(const ckpt::LoadedCheckpoint& checkpoint, const model::Transformer& model,
                  const std::function<std::string(const std::string&)>& name_of, float* out) const;

  parallel::DilocoOptions options_;
  std::unique_ptr<parallel::SiteGroups> groups_;
  std::unique_ptr<parallel::DilocoOuter> outer_;
  int64_t reported_bytes_ = 0;
  mutable std::vector<float> saved_from_device_;  // the outer state of a GPU's last checkpoint, on the host
};

}  // namespace loom::train
