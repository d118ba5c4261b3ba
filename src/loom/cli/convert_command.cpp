// loom convert --to-hf CHECKPOINT OUT_DIR [--dtype f32|bf16]
// loom convert --from-hf HF_DIR OUT_ROOT [--config RUN.yaml] [--tokenizer NAME]
// loom convert --to-gguf CHECKPOINT OUT.gguf [--dtype f32|f16|bf16]
#include <iomanip>
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/interop/gguf/gguf_export.h"
#include "loom/interop/hf/hf_convert.h"

namespace loom::cli {

void register_convert(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    bool to_hf = false, from_hf = false, to_gguf = false;
    std::string source, output;
    interop::hf::HfExportOptions to;
    interop::hf::HfImportOptions from;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "convert between loom checkpoints and Hugging Face model directories (config.json + safetensors)");
  CLI::Option* to = cmd->add_flag("--to-hf", args->to_hf,
                                  "SOURCE is a loom checkpoint (directory or root); write OUTPUT/model.safetensors "
                                  "and OUTPUT/config.json (model parameters only, no optimizer state)");
  CLI::Option* from = cmd->add_flag("--from-hf", args->from_hf,
                                    "SOURCE is a Hugging Face model directory; write a step-0 checkpoint under "
                                    "the new checkpoint root OUTPUT");
  CLI::Option* to_gguf = cmd->add_flag("--to-gguf", args->to_gguf,
                                       "SOURCE is a loom checkpoint (Llama, Qwen 2, Mixtral and Qwen2-MoE styles, "
                                       "heterogeneous layers as llama.cpp's deci, Nemotron-H hybrids as its "
                                       "nemotron_h; byte, tiktoken or byte-level BPE hf tokenizer); write the GGUF v3 "
                                       "file OUTPUT that llama.cpp runs");
  to->excludes(from);
  to_gguf->excludes(to)->excludes(from);
  cmd->add_option("source", args->source, "checkpoint (--to-hf) or Hugging Face model directory (--from-hf)")->required();
  cmd->add_option("output", args->output, "output directory (--to-hf) or new checkpoint root (--from-hf)")->required();
  CLI::Option* dtype = cmd->add_option("--dtype", args->to.dtype, "--to-hf: tensor dtype in model.safetensors (f32, bf16); --to-gguf: of its matrices (f32, f16, bf16)")
                           ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  CLI::Option* config = cmd->add_option("--config", args->from.config_path,
                                        "--from-hf: run config (YAML) for the checkpoint's non-model sections");
  CLI::Option* tokenizer = cmd->add_option("--tokenizer", args->from.tokenizer,
                                           "--from-hf: data.tokenizer to record (default: the directory's own tokenizer files, if any), one of " + known_tokenizer_list(", ") +
                                               " (default: the one --to-hf recorded, else byte); its vocabulary "
                                               "must fit the model's vocab_size");
  dtype->excludes(from);
  config->needs(from);
  tokenizer->needs(from);
  commands.push_back({cmd, [args] {
                        LOOM_CHECK(args->to_hf || args->from_hf || args->to_gguf,
                                   "loom convert: say which way: --to-gguf, --to-hf or --from-hf");
                        LOOM_CHECK(args->to_gguf || args->to.dtype != "f16", "--dtype f16 is for --to-gguf only");
                        if (args->to_gguf) {
                          const interop::gguf::GgufExportResult r = interop::gguf::export_to_gguf(
                              args->source, args->output, {args->to.dtype});
                          std::cout << "wrote " << args->output << " (GGUF v3, " << r.architecture << ", "
                                    << r.tensors << " tensors, " << r.bytes << " bytes, " << args->to.dtype
                                    << ") from " << r.checkpoint << " (step " << r.step << ")" << std::endl;
                          if (!r.note.empty()) std::cerr << "loom convert: note: " << r.note << std::endl;
                          return 0;
                        }
                        if (args->to_hf) {
                          const interop::hf::HfExportResult r = interop::hf::export_to_hf(args->source, args->output, args->to);
                          std::cout << "wrote " << args->output << "/model.safetensors (" << r.tensors << " tensors, "
                                    << std::fixed << std::setprecision(1) << static_cast<double>(r.bytes) / 1e6
                                    << " MB, " << args->to.dtype << ") and " << args->output << "/config.json ("
                                    << r.architecture << ") from " << r.checkpoint << " (step " << r.step
                                    << "); optimizer state is not exported" << std::endl;
                        } else {
                          const interop::hf::HfImportResult r =
                              interop::hf::import_from_hf(args->source, args->output, args->from);
                          std::cout << "wrote " << r.checkpoint << " (" << r.architecture << ", " << r.tensors
                                    << " parameters as f32, zero optimizer moments, tokenizer " << r.tokenizer
                                    << ")" << std::endl;
                        }
                        return 0;
                      }});
}

}  // namespace loom::cli
