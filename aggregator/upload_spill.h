// Where the aggregator keeps the compressed bytes of uploads in flight: in memory up to a
// budget shared by all connections, beyond it in anonymous temporary files, so that server
// memory stays bounded however many clients upload at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace starling::aggregator {

// pwrite / pread of all of `data` / `out` at `offset` of `fd`, through short transfers and
// EINTR. Internal errors read "writing WHAT: ..." / "reading WHAT: ..." (a file read past its
// end: "short file").
Status write_all_at(int fd, uint64_t offset, std::span<const char> data, const std::string& what);
Status read_all_at(int fd, uint64_t offset, std::span<char> out, const std::string& what);

// An unlinked temporary file in `dir` (gone from the directory at once, from the disk when
// closed). Not thread-safe.
class SpillFile {
 public:
  static Result<std::unique_ptr<SpillFile>> create(const std::filesystem::path& dir);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  Status write(uint64_t offset, std::string_view data);
  // The first `size` bytes written.
  Result<std::string> read(uint64_t size) const;
  // Bytes [offset, offset + out.size()).
  Status read_at(uint64_t offset, std::span<char> out) const;

 private:
  explicit SpillFile(int fd, std::string dir) : fd_(fd), dir_(std::move(dir)) {}
  int fd_;
  std::string dir_;  // for error messages
};

// Bytes reserved from a shared in-memory budget; released when destroyed. The pool must
// outlive every reservation taken from it.
class MemoryReservation {
 public:
  // Reserves `bytes` from `*used` when *used + bytes <= budget; nullptr otherwise.
  static std::unique_ptr<MemoryReservation> take(uint64_t* used, uint64_t budget, uint64_t bytes);
  ~MemoryReservation() { *used_ -= bytes_; }
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;

 private:
  MemoryReservation(uint64_t* used, uint64_t bytes) : used_(used), bytes_(bytes) {}
  uint64_t* used_;
  uint64_t bytes_;
};

}  // namespace starling::aggregator
