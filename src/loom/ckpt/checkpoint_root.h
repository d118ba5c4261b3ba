#pragma once
// A checkpoint root: the directory holding one `step-NNNNNNNN` directory per saved step, a
// `latest` file naming the newest complete one, and `.tmp-*` directories of saves in progress.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::ckpt {

inline constexpr std::string_view kLatestFile = "latest";
inline constexpr std::string_view kTempPrefix = ".tmp-";

// step-00000060 (at least 8 digits).
std::string step_dir_name(int64_t step);
// The step of a `step-NNNNNNNN` name; nullopt for any other name.
std::optional<int64_t> parse_step_dir_name(std::string_view name);
// True when `path` is a checkpoint directory (holds manifest.json or is named step-NNNNNNNN).
bool is_checkpoint_dir(const std::string& path);

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
  bool has_manifest = false;  // saves publish a directory only once it is complete
};
// Every step directory under `root`, by ascending step; empty when `root` does not exist.
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// The directory name `latest` holds, or nullopt when there is no `latest` file.
std::optional<std::string> read_latest(const std::string& root);
// Points `latest` at `dir_name` atomically.
void write_latest(const std::string& root, const std::string& dir_name);

// A checkpoint directory as is; a root: the directory `latest` names (without verifying it), or
// the newest step directory when there is no `latest`. Throws naming the path when there is none.
// `load_checkpoint` may settle on an older one when this one turns out corrupt.
std::string resolve_checkpoint(const std::string& path_or_root);

// Retention after a save of step `saved_step`: keeps the newest `keep` step directories with a
// manifest at or below `saved_step` (keep <= 0: all), deletes older ones and `.tmp-*`
// directories left by saves whose process has died. Directories above `saved_step` (left by a
// run that has since been resumed from an earlier step) are never deleted. Failures to delete
// are reported on stderr, not thrown: the save itself has succeeded.
void apply_retention(const std::string& root, int64_t saved_step, int keep);

}  // namespace loom::ckpt
