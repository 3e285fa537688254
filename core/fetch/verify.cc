// File verification: existence, then SHA-256 against the table.
#include "core/fetch/verify.h"

#include <system_error>

#include "core/fetch/sha256.h"

namespace starling::fetch {

std::string_view file_state_name(FileState state) {
  switch (state) {
    case FileState::kMissing:
      return "missing";
    case FileState::kVerified:
      return "ok";
    case FileState::kMismatch:
      return "MISMATCH";
    case FileState::kNoExpectedHash:
      return "no expected hash";
    case FileState::kUnreadable:
      return "UNREADABLE";
  }
  return "unknown";
}

FileCheck check_file(const std::filesystem::path& data_dir, std::string_view relative_path,
                     const HashTable& expected) {
  FileCheck c;
  c.relative_path = std::string(relative_path);
  if (const auto it = expected.find(relative_path); it != expected.end()) c.expected = it->second;
  const std::filesystem::path path = data_dir / relative_path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    c.state = FileState::kMissing;
    return c;
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) c.bytes = static_cast<int64_t>(size);
  auto hash = sha256_file(path);
  if (!hash.ok()) {
    c.state = FileState::kUnreadable;
    c.detail = hash.status().message();
    return c;
  }
  c.actual = std::move(*hash);
  if (c.expected.empty()) {
    c.state = FileState::kNoExpectedHash;
  } else {
    c.state = c.actual == c.expected ? FileState::kVerified : FileState::kMismatch;
  }
  return c;
}

}  // namespace starling::fetch
