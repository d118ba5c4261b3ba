#pragma once
// The learner role of `loom grpo` (`loom grpo --role learner CONFIG`): the ranks of the
// trainer (runtime.ranks as threads, or one process per rank under mpirun/srun) running the
// GRPO learner step by step. For step s (starting after the learner's resumed checkpoint):
// rank 0 asks the controller for the step's groups, every rank gets them (broadcast_text),
// GrpoLearner::step trains them, save() writes the weights, and rank 0 reports the checkpoint
// (POST /step_done) so that the controller refits the generation workers.
#include <iosfwd>
#include <string>

#include "loom/config/run_config.h"

namespace loom::rl {

struct LearnerPlace {
  std::string grpo_dir;  // the controller's run.dir/grpo, where roles.json names it
  // grpo.launch = external: rank 0 registers (grpo_dir/roles/learner-0.json, its ranks) and
  // waits for a roles.json listing it.
  bool external = false;
  int job_rank = -1;     // rank 0's rank in the MPI job, -1 outside one
};

void run_learner(const config::RunConfig& config, const LearnerPlace& place, std::ostream& out);

}  // namespace loom::rl
