// loom serve CHECKPOINT [--host H] [--port P] [--max-queue N] [--tp N] [--device cpu|cuda] [--dtype D]
//            [--kv-cache-dtype D] [--kv-cache-mb M] ...
// (under mpirun -np N with --tp N: rank 0 serves, the other ranks follow; docs/serving.md)
#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/cli/memory_advice.h"
#include "loom/cli/serve_until_signal.h"
#include "loom/comm/launch.h"
#include "loom/infer/engine.h"
#include "loom/infer/speculative.h"
#include "loom/serve/server.h"

namespace loom::cli {

namespace {

struct Args {
  std::string checkpoint;
  infer::EngineOptions engine;
  serve::ServeOptions server;
  int64_t kv_cache_mb = 64;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string speculative_config;
  double comm_timeout_s = 300;  // under mpirun
};

// The engine (with its tensor-parallel ranks) and the HTTP server, until SIGTERM / SIGINT.
int serve_http(const Args& args) {
  infer::Engine engine(args.checkpoint, args.engine);
  serve::Server server(engine, args.server);
  serve_until_signal(
      [&] {
        server.run([&](int port) {
          std::cout << "loom serve: listening on http://" << args.server.host << ":" << port << " (model '"
                    << args.server.model_name << "', " << engine.blocks().blocks() << " KV blocks of "
                    << args.engine.block_size << " positions of " << config::name_of(engine.kv_cache_dtype()) << ", GEMMs in "
                    << config::name_of(engine.recipe()) << ")" << std::endl;
          if (args.engine.speculative_tokens > 0) {
            std::cout << "loom serve: speculative decoding: " << args.engine.speculative_tokens
                      << " draft tokens a step from the model's multi-token prediction depths" << std::endl;
          }
        });
      },
      [&] {
        std::cerr << "loom serve: stopping: finishing the running requests" << std::endl;
        server.shutdown();
      });
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, std::vector<Command>& commands) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a checkpoint over an OpenAI-compatible HTTP API (docs/serving.md)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or checkpoint root")->required();
  cmd->add_option("--host", args->server.host, "address to listen on");
  cmd->add_option("--port", args->server.port, "port (0: any free one, printed on stdout)")->check(CLI::Range(0, 65535));
  cmd->add_option("--max-queue", args->server.max_queue, "requests waiting for the engine before 429")->check(positive());
  cmd->add_option("--model-name", args->server.model_name, "the model id clients send (and /v1/models lists)");
  cmd->add_option("--profile-dir", args->server.profile_dir,
                  "directory for the traces POST /start_profile and /stop_profile record (off without it)");
  cmd->add_option("--tp", args->engine.tp, "tensor-parallel ranks (threads; under mpirun, the processes: mpirun -np N)")->check(positive());
  cmd->add_option("--device", args->device,
                  "where the model runs: cpu | cuda (weights and KV cache on the GPU; tp rank r on GPU r modulo the GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", args->dtype,
                  "the linear layers' GEMMs: auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16 (docs/serving.md)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}));
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                  "the KV cache's elements: auto (bf16 under bf16 or fp16 GEMMs, else fp32) | fp32 | bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  cmd->add_option("--kv-cache-mb", args->kv_cache_mb, "cache memory per rank, MiB (a hybrid model's Mamba state pool, then KV blocks)")->check(positive());
  cmd->add_option("--block-size", args->engine.block_size, "positions per KV cache block")->check(positive());
  cmd->add_option("--max-batch-tokens", args->engine.max_batch_tokens,
                  "tokens in one step's forward (decode tokens + prompt chunks)")->check(positive());
  cmd->add_option("--max-running", args->engine.max_running, "samples generated at once (a hybrid model's Mamba state slots)")->check(positive());
  cmd->add_option("--comm-timeout-s", args->comm_timeout_s,
                  "under mpirun: seconds rank 0 waits for a follower rank (and a follower for rank 0) before failing")
      ->check(CLI::Range(2.0, 86400.0));
  cmd->add_option("--speculative-config", args->speculative_config,
                  "speculative decoding, as vLLM's: '{\"method\": \"mtp\", \"num_speculative_tokens\": N}' "
                  "drafts N tokens a step with the model's multi-token prediction depths (docs/serving.md)");
  cmd->add_flag("!--no-prefix-caching", args->engine.prefix_caching, "do not reuse KV blocks of shared prompt prefixes (always off for hybrid models)");
  commands.push_back({cmd, [args] {
                        args->engine.kv_cache_bytes = args->kv_cache_mb << 20;
                        args->engine.device = args->device == "cuda" ? config::RuntimeDevice::Cuda : config::RuntimeDevice::Cpu;
                        args->engine.dtype = infer::parse_inference_dtype(args->dtype);
                        args->engine.kv_cache_dtype = infer::parse_kv_cache_setting(args->kv_cache_dtype);
                        if (!args->speculative_config.empty()) {
                          args->engine.speculative_tokens = infer::parse_speculative_config(args->speculative_config);
                        }
                        const std::string advice =
                            serving_memory_advice(args->kv_cache_mb, args->engine.max_batch_tokens);
                        if (comm::detect_backend() != "mpi") {
                          return with_memory_advice(advice, [&] { return serve_http(*args); });
                        }
                        // Under mpirun: every tensor-parallel rank is one process; rank 0 serves.
                        comm::LaunchOptions launch;
                        launch.backend = "mpi";
                        launch.comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(args->comm_timeout_s * 1000));
                        comm::launch(launch, [&](comm::Communicator& world) {
                          if (world.rank() == 0) {
                            args->engine.world = &world;
                            with_memory_advice(advice, [&] { return serve_http(*args); });
                            return;
                          }
                          // mpirun's SIGTERM reaches every rank: followers stop when rank 0 has
                          // finished its requests and tells them to.
                          std::signal(SIGTERM, SIG_IGN);
                          std::signal(SIGINT, SIG_IGN);
                          infer::follow_engine(args->checkpoint, args->engine, world);
                        });
                        return 0;
                      }});
}

}  // namespace loom::cli
