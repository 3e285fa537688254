// POSIX file helpers for core/io: an owning file descriptor, full reads at an offset, and
// AtomicFile, which makes a file appear complete or not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "core/util/status.h"

namespace starling::io {

// Maps an errno value to a Status: "<what> <path>: <strerror>". ENOENT -> NotFound,
// EACCES/EPERM/EROFS -> PermissionDenied, ENOSPC/EDQUOT -> ResourceExhausted, else Internal.
Status errno_status(int err, std::string_view what, const std::filesystem::path& path);

// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// Opens `path` read-only. Errors as errno_status.
Result<UniqueFd> open_for_read(const std::filesystem::path& path);

// Reads exactly n bytes at `offset`. A file that ends early is DataLoss.
Status read_exact_at(int fd, void* buf, size_t n, uint64_t offset,
                     const std::filesystem::path& path);

// Writes a file under a temporary name in the destination's directory; commit() fsyncs it,
// renames it over the destination and fsyncs the directory, so readers (and a crash) see
// either the old file or the complete new one. Destroyed without commit(), it removes the
// temporary. The new file gets mode 0644. Move-only; not thread-safe.
class AtomicFile {
 public:
  // REQUIRES: the parent directory of `path` exists (else NotFound).
  static Result<AtomicFile> create(const std::filesystem::path& path);

  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends n bytes. REQUIRES: commit() not yet called.
  Status append(const void* data, size_t n);
  // Makes the file visible under its final name. Call at most once.
  Status commit();

 private:
  AtomicFile(UniqueFd fd, std::filesystem::path target, std::filesystem::path temp);

  UniqueFd fd_;
  std::filesystem::path target_;
  std::filesystem::path temp_;
  bool done_ = false;  // committed, or moved from
};

}  // namespace starling::io
