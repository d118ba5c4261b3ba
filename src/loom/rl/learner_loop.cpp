#include "loom/rl/learner_loop.h"

#include <unistd.h>

#include <memory>
#include <ostream>

#include "loom/ckpt/checkpoint_root.h"
#include "loom/comm/role_world.h"
#include "loom/rl/communication.h"
#include "loom/rl/grpo_learner.h"
#include "loom/rl/learner_client.h"
#include "loom/rl/refit_communication.h"
#include "loom/train/model_setup.h"
#include "loom/train/run_ranks.h"
#include "loom/train/trainer.h"

namespace loom::rl {

namespace {
// The controller's URL: from roles.json; external: once it lists this learner's registration.
std::string controller_url(const config::RunConfig& config, const LearnerPlace& place, const Registration& me) {
  if (!place.external) return find_controller(place.grpo_dir, 600.0);
  write_registration(place.grpo_dir, me, true);
  return find_controller_listing(place.grpo_dir, me, 2.0 * config.grpo.register_timeout_s);
}
}  // namespace

void run_learner(const config::RunConfig& config, const LearnerPlace& place, std::ostream& out) {
  Registration me;
  me.role = "learner";
  me.host = this_host();
  me.pid = ::getpid();
  me.job_rank = place.job_rank;
  train::run_on_ranks(config, out, [&](comm::Communicator& world) {
    GrpoLearner learner(config, world, out);
    std::unique_ptr<LearnerClient> client;
    if (world.rank() == 0) {
      me.ranks = world.size();
      client = std::make_unique<LearnerClient>(controller_url(config, place, me), config.grpo.step_timeout_s);
      // Resumed from a checkpoint saved just before a crash, whose report never reached the
      // controller: report it now, so that the workers are refit and the steps agree.
      const int64_t resumed = learner.weight_version();
      if (resumed > 0 && client->steps_done() == resumed - 1)
        client->step_done(resumed - 1, train::checkpoint_root(config) + "/" + ckpt::step_dir_name(resumed), {{"resumed", true}});
    }
    // grpo.refit = comm: the learner's ranks and the workers' processes share an MPI job.
    std::unique_ptr<comm::Communicator> refit;
    if (config.grpo.refit == "comm") {
      LOOM_CHECK(comm::in_role_world(), "grpo.refit = 'comm': this learner is not in an MPI job with the generation workers "
                                        "(one mpirun with every role, srun --multi-prog, a heterogeneous Slurm job)");
      LOOM_CHECK(world.backend() == "mpi" || world.size() == 1,
                 "grpo.refit = 'comm' needs each learner rank in a process of its own (runtime.backend=auto or mpi under the "
                 "launcher); runtime.backend = threads runs " + std::to_string(world.size()) + " ranks in one");
      refit = comm::shared_communicator("refit", refit_comm_options(config));
    }
    const int64_t bucket_bytes = int64_t{config.grpo.refit_bucket_mb} << 20;
    for (int64_t step = learner.weight_version(); step < config.train.steps; ++step) {
      const std::string text = broadcast_text(world.rank() == 0 ? client->batch_text(step) : std::string(), world, 0);
      const LearnerStep result = learner.step(groups_of_batch(text, step));
      const std::string checkpoint = learner.save();
      if (refit)
        send_parameters(*refit, world.size(), learner.trainer().parameter_shards(), "step-" + std::to_string(step + 1), bucket_bytes);
      if (world.rank() == 0) client->step_done(step, checkpoint, result.to_json(), refit ? "comm" : "checkpoint");
    }
    learner.finish();
    if (world.rank() == 0 && place.external) remove_registration(place.grpo_dir, me);
    return train::TrainSummary{};
  });
}

}  // namespace loom::rl
