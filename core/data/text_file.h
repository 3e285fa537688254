// read_text_file: loads a whole file into memory, with errors that name the path.
#pragma once

#include <filesystem>
#include <string>

#include "core/util/status.h"

namespace starling::data {

// Returns the file's bytes unchanged (no newline or encoding conversion).
// Errors: NotFound when the path does not exist, InvalidArgument when it is not a regular file,
// DataLoss when reading fails part way. Every message names the path.
Result<std::string> read_text_file(const std::filesystem::path& path);

}  // namespace starling::data
