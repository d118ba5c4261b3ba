// follow_engine: ranks 1.. of `loom serve` under mpirun.
#include "loom/core/error.h"
#include "loom/infer/engine.h"

namespace loom::infer {

void follow_engine(const std::string& checkpoint_path, const EngineOptions& options, comm::Communicator& world) {
  LOOM_CHECK(world.rank() != 0, "follow_engine runs on the MPI ranks other than 0 (rank 0 runs the engine)");
  LOOM_CHECK(options.tp == world.size(),
             "--tp " + std::to_string(options.tp) + " but the MPI job has " + std::to_string(world.size()) +
                 " processes (mpirun -np): under mpirun every tensor-parallel rank is one process");
  const ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  std::unique_ptr<data::Tokenizer> tokenizer;
  const config::ModelConfig model = served_model_config(checkpoint, tokenizer);
  ModelRunner runner(model, world, checkpoint, rank_setup(options));
  runner.follow();
}

}  // namespace loom::infer
