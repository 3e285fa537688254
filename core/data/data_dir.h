// Finding the datasets folder (shared/data) and the files of named datasets inside it.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::data {

// Everything resolve_data_dir looks at, made explicit so tests need no process state.
struct DataDirSearch {
  std::string configured;  // data_dir from the config; wins when non-empty
  std::string env_value;   // STARLING_DATA_DIR; empty when unset
  // Folders to walk up from (in order); at each ancestor A, A/shared/data and A/../shared/data
  // are tried.
  std::vector<std::filesystem::path> start_dirs;
};

// Returns the absolute data folder: `configured` if non-empty, else the environment value if
// non-empty, else the first existing candidate under `start_dirs`. An explicit setting (configured
// or environment) that is not a directory is an error, never silently skipped.
// Errors: NotFound naming every path tried and how to fix it.
Result<std::filesystem::path> resolve_data_dir(const DataDirSearch& search);

// The same, with the environment variable STARLING_DATA_DIR and the start folders the current
// working directory and the directory of /proc/self/exe.
Result<std::filesystem::path> resolve_data_dir(const std::string& configured);

// Dataset names understood by resolve_dataset_file, e.g. "tinyshakespeare", "wikitext-2-valid".
std::span<const std::string_view> known_dataset_names();

// Maps a dataset name to its file under data_dir ("tinyshakespeare" -> tinyshakespeare/input.txt).
// Errors: InvalidArgument for an unknown name (listing the known ones); NotFound naming the
// missing file.
Result<std::filesystem::path> resolve_dataset_file(const std::filesystem::path& data_dir,
                                                   std::string_view dataset_name);

}  // namespace starling::data
