// Downloading dataset files: fetched to a temp file beside the target, SHA-256 checked, and only
// then renamed into place, so a failed or wrong download never leaves a file behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/fetch/catalog.h"
#include "core/fetch/http.h"

namespace starling::fetch {

struct DownloadOptions {
  bool force = false;  // download again even when a verified copy is present
  HttpOptions http;
};

enum class FileOutcome { kDownloaded, kAlreadyVerified };

struct FileReport {
  std::string relative_path;
  std::string url;  // empty when the file was already present and verified
  FileOutcome outcome = FileOutcome::kDownloaded;
  std::string sha256;
  int64_t bytes = 0;
};

// The URL of each file: the catalog's, or `url_override` when non-empty. An override ending in
// '/' is a mirror laid out like the data folder (override + relative path) and works for any
// number of files; any other override is the URL of the one file.
// Errors: InvalidArgument when a single-file URL is given for several files.
Result<std::vector<std::string>> resolve_urls(std::span<const CatalogFile> files,
                                              std::string_view url_override);

// Makes data_dir/relative_path hold the file whose SHA-256 is expected[relative_path]:
// - present and verified, and not options.force: nothing is fetched (kAlreadyVerified);
// - otherwise `url` is fetched into a temp file in the target's folder, its hash checked, and it
//   is renamed over the target (a present but corrupt file is replaced).
// Creates missing folders. On any error no new file is left behind and an existing target is
// untouched. Errors (each naming relative_path): FailedPrecondition when `expected` has no
// hash for the file; DataLoss on a hash mismatch (naming URL, expected and actual hash); the
// errors of http_get; Internal for local file-system failures.
Result<FileReport> download_file(const std::string& url, const std::filesystem::path& data_dir,
                                 std::string_view relative_path, const HashTable& expected,
                                 const DownloadOptions& options);

}  // namespace starling::fetch
