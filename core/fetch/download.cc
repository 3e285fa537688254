// Download into a temp file (mkstemp beside the target), hash while streaming, rename on match.
#include "core/fetch/download.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>

#include "core/fetch/sha256.h"
#include "core/fetch/verify.h"

namespace starling::fetch {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

// A temp file that is removed on destruction unless commit() renamed it into place.
class TempFile {
 public:
  static Result<TempFile> create_beside(const fs::path& target) {
    std::string templ = target.string() + ".part-XXXXXX";
    const int fd = ::mkstemp(templ.data());
    if (fd < 0) {
      return internal_error("cannot create a temp file beside " + target.string() + ": " +
                            errno_text(errno));
    }
    return TempFile(fd, fs::path(templ));
  }

  TempFile(TempFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {
    o.path_.clear();
  }
  TempFile& operator=(TempFile&&) = delete;
  TempFile(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  Status write(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return internal_error("write " + path_.string() + ": " + errno_text(errno));
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return ok_status();
  }

  // Flushes to disk, closes, and renames over `target` (atomic within one file system).
  Status commit(const fs::path& target) {
    // mkstemp makes the file 0600; a dataset is an ordinary readable file.
    if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) {
      return internal_error("finish " + path_.string() + ": " + errno_text(errno));
    }
    const int rc = ::close(std::exchange(fd_, -1));
    if (rc != 0) return internal_error("close " + path_.string() + ": " + errno_text(errno));
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      return internal_error("rename " + path_.string() + " to " + target.string() + ": " +
                            errno_text(errno));
    }
    path_.clear();
    return ok_status();
  }

 private:
  TempFile(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  fs::path path_;
};

}  // namespace

Result<std::vector<std::string>> resolve_urls(std::span<const CatalogFile> files,
                                              std::string_view url_override) {
  std::vector<std::string> urls;
  if (url_override.empty()) {
    for (const auto& f : files) urls.emplace_back(f.url);
  } else if (url_override.ends_with('/')) {
    for (const auto& f : files)
      urls.push_back(std::string(url_override) + std::string(f.relative_path));
  } else if (files.size() == 1) {
    urls.emplace_back(url_override);
  } else {
    return invalid_argument("--url '" + std::string(url_override) + "' names one file, but " +
                            std::to_string(files.size()) +
                            " files were selected; give a mirror base ending in '/' (each file is "
                            "then fetched from that base + its path, such as " +
                            std::string(files.front().relative_path) + ") or name one file");
  }
  return urls;
}

Result<FileReport> download_file(const std::string& url, const fs::path& data_dir,
                                 std::string_view relative_path, const HashTable& expected,
                                 const DownloadOptions& options) {
  const std::string rel(relative_path);
  const auto want = expected.find(relative_path);
  if (want == expected.end()) {
    return failed_precondition(rel +
                               ": no expected SHA-256 for this file; refusing to install "
                               "an unverified download");
  }
  const fs::path target = data_dir / relative_path;

  FileReport report;
  report.relative_path = rel;
  if (!options.force) {
    const FileCheck c = check_file(data_dir, relative_path, expected);
    if (c.state == FileState::kVerified) {
      report.outcome = FileOutcome::kAlreadyVerified;
      report.sha256 = c.actual;
      report.bytes = c.bytes;
      return report;
    }
  }

  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) {
    return internal_error(rel + ": cannot create " + target.parent_path().string() + ": " +
                          ec.message());
  }
  ASSIGN_OR_RETURN(TempFile tmp, TempFile::create_beside(target), rel);
  Sha256 hash;
  int64_t bytes = 0;
  RETURN_IF_ERROR(http_get(url, options.http,
                           [&](std::string_view chunk) {
                             hash.update(chunk);
                             bytes += static_cast<int64_t>(chunk.size());
                             return tmp.write(chunk);
                           }),
                  rel);
  const std::string actual = hash.final_hex();
  if (actual != want->second) {
    return data_loss(rel + ": SHA-256 mismatch for " + url + ": expected " + want->second +
                     ", got " + actual + " (" + std::to_string(bytes) +
                     " bytes); the download was discarded");
  }
  RETURN_IF_ERROR(tmp.commit(target), rel);
  report.url = url;
  report.outcome = FileOutcome::kDownloaded;
  report.sha256 = actual;
  report.bytes = bytes;
  return report;
}

}  // namespace starling::fetch
