// POSIX file helpers: errno mapping, owned descriptors, exact reads and atomic replacement.
#include "core/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace starling::io {

namespace fs = std::filesystem;

Status errno_status(int err, std::string_view what, const fs::path& path) {
  std::string m(what);
  m += " ";
  m += path.string();
  m += ": ";
  m += std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return not_found(std::move(m));
    case EACCES:
    case EPERM:
    case EROFS:
      return permission_denied(std::move(m));
    case ENOSPC:
    case EDQUOT:
      return resource_exhausted(std::move(m));
    default:
      return internal_error(std::move(m));
  }
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<UniqueFd> open_for_read(const fs::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno_status(errno, "cannot open", path);
  return UniqueFd(fd);
}

Status read_exact_at(int fd, void* buf, size_t n, uint64_t offset, const fs::path& path) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, "cannot read", path);
    }
    if (got == 0) {
      return data_loss(path.string() + ": file ended at byte " + std::to_string(offset) +
                       " while reading (changed during the read?)");
    }
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return ok_status();
}

namespace {

Status write_all(int fd, const void* data, size_t n, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, "cannot write", path);
    }
    p += put;
    n -= static_cast<size_t>(put);
  }
  return ok_status();
}

// Makes a rename inside `dir` durable.
Status fsync_dir(const fs::path& dir) {
  const fs::path d = dir.empty() ? fs::path(".") : dir;
  UniqueFd fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno_status(errno, "cannot open directory", d);
  if (::fsync(fd.get()) != 0) return errno_status(errno, "cannot fsync directory", d);
  return ok_status();
}

}  // namespace

AtomicFile::AtomicFile(UniqueFd fd, fs::path target, fs::path temp)
    : fd_(std::move(fd)), target_(std::move(target)), temp_(std::move(temp)) {}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : fd_(std::move(o.fd_)),
      target_(std::move(o.target_)),
      temp_(std::move(o.temp_)),
      done_(o.done_) {
  o.done_ = true;
}

AtomicFile::~AtomicFile() {
  if (done_) return;
  fd_.reset();
  ::unlink(temp_.c_str());
}

Result<AtomicFile> AtomicFile::create(const fs::path& path) {
  if (path.filename().empty()) return invalid_argument("not a file path: '" + path.string() + "'");
  std::string templ = path.string() + ".tmp.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  UniqueFd fd(::mkstemp(buf.data()));
  if (!fd.valid()) return errno_status(errno, "cannot create a temporary file beside", path);
  fs::path temp(buf.data());
  AtomicFile f(std::move(fd), path, std::move(temp));
  if (::fchmod(f.fd_.get(), 0644) != 0) return errno_status(errno, "cannot chmod", f.temp_);
  return f;
}

Status AtomicFile::append(const void* data, size_t n) {
  if (done_) return failed_precondition("append to a committed file " + target_.string());
  return write_all(fd_.get(), data, n, temp_);
}

Status AtomicFile::commit() {
  if (done_) return failed_precondition("commit of a committed file " + target_.string());
  if (::fsync(fd_.get()) != 0) return errno_status(errno, "cannot fsync", temp_);
  if (::close(fd_.release()) != 0) return errno_status(errno, "cannot close", temp_);
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    return errno_status(errno, "cannot rename " + temp_.string() + " to", target_);
  }
  done_ = true;
  return fsync_dir(target_.parent_path());
}

}  // namespace starling::io
