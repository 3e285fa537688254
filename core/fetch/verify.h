// Checking dataset files in a data folder against their expected SHA-256.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/fetch/catalog.h"

namespace starling::fetch {

enum class FileState {
  kMissing,         // no file at the path
  kVerified,        // present, hash equals the expected one
  kMismatch,        // present, hash differs (corrupt, truncated or a different file)
  kNoExpectedHash,  // present, but the table has no hash for it
  kUnreadable,      // present, but it could not be read (see detail)
};

std::string_view file_state_name(FileState state);  // "ok", "missing", "MISMATCH", ...

struct FileCheck {
  std::string relative_path;
  FileState state = FileState::kMissing;
  std::string expected;  // empty when the table has none
  std::string actual;    // empty unless the file was hashed
  int64_t bytes = 0;     // size of the file when present
  std::string detail;    // the read error for kUnreadable
};

// Hashes data_dir/relative_path (when present) and compares it with expected[relative_path].
FileCheck check_file(const std::filesystem::path& data_dir, std::string_view relative_path,
                     const HashTable& expected);

}  // namespace starling::fetch
