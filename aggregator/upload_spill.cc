// Spill files and the in-memory upload budget.
#include "aggregator/upload_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace starling::aggregator {

Result<std::unique_ptr<SpillFile>> SpillFile::create(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string tmpl = (dir / "upload-XXXXXX").string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) {
    return internal_error("cannot create a spill file in " + dir.string() + ": " +
                          std::strerror(errno));
  }
  ::unlink(tmpl.c_str());
  return std::unique_ptr<SpillFile>(new SpillFile(fd, dir.string()));
}

SpillFile::~SpillFile() { ::close(fd_); }

Status write_all_at(int fd, uint64_t offset, std::span<const char> data, const std::string& what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return internal_error("writing " + what + ": " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

Status read_all_at(int fd, uint64_t offset, std::span<char> out, const std::string& what) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return internal_error("reading " + what + ": " +
                            (n == 0 ? std::string("short file") : std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

Status SpillFile::write(uint64_t offset, std::string_view data) {
  return write_all_at(fd_, offset, data, "a spill file in " + dir_);
}

Result<std::string> SpillFile::read(uint64_t size) const {
  std::string out(size, '\0');
  RETURN_IF_ERROR(read_at(0, out));
  return out;
}

Status SpillFile::read_at(uint64_t offset, std::span<char> out) const {
  return read_all_at(fd_, offset, out, "a spill file in " + dir_);
}

std::unique_ptr<MemoryReservation> MemoryReservation::take(uint64_t* used, uint64_t budget,
                                                           uint64_t bytes) {
  if (*used + bytes > budget) return nullptr;
  *used += bytes;
  return std::unique_ptr<MemoryReservation>(new MemoryReservation(used, bytes));
}

}  // namespace starling::aggregator
