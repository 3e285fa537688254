// Fetching a run's missing dataset (ensure.h).
#include "core/fetch/ensure.h"

#include <cstdlib>

#include "core/data/data_dir.h"
#include "core/fetch/catalog.h"
#include "core/fetch/download.h"

namespace starling::fetch {
namespace fs = std::filesystem;

EnsureOptions ensure_options_from_env() {
  EnsureOptions o;
  const char* off = std::getenv("STARLING_NO_DOWNLOAD");
  o.download = off == nullptr || *off == '\0' || std::string_view(off) == "0";
  if (const char* mirror = std::getenv("STARLING_DATA_MIRROR"); mirror && *mirror) {
    o.url_override = mirror;
  }
  return o;
}

Result<std::string> catalog_name_for(std::string_view data_name) {
  if (data_name == "shakespeare") data_name = "tinyshakespeare";
  for (const auto& d : datasets()) {
    if (d.name == data_name) return std::string(d.name);
    for (const auto& f : d.files) {
      if (f.name == data_name) return std::string(d.name);
    }
  }
  return not_found("no catalog dataset holds '" + std::string(data_name) + "'");
}

Result<fs::path> ensure_dataset(const std::string& configured, std::string_view name,
                                const EnsureOptions& options) {
  fs::path dir;
  if (auto found = data::resolve_data_dir(configured); found.ok()) {
    dir = *found;
  } else if (!configured.empty()) {
    return found.status();  // an explicit folder that is not there: never guessed around
  } else {
    dir = (fs::current_path() / "shared" / "data").lexically_normal();
  }
  ASSIGN_OR_RETURN(const auto files, select_files(name));
  std::vector<CatalogFile> missing;
  for (const auto& f : files) {
    // Only what is missing: a present file is the user's (a cut, a local variant) and is never
    // replaced here; `starling data verify` reports one that differs from the pinned hash.
    std::error_code ec;
    if (!fs::exists(dir / fs::path(f.relative_path), ec)) missing.push_back(f);
  }
  if (missing.empty() || !options.download) return dir;
  ASSIGN_OR_RETURN(const auto urls, resolve_urls(missing, options.url_override));
  std::fprintf(options.out,
               "starling: dataset %s is not (all) in %s: downloading %zu file(s), each checked "
               "against its pinned SHA-256 (STARLING_NO_DOWNLOAD=1 turns this off)\n",
               std::string(name).c_str(), dir.c_str(), missing.size());
  for (size_t i = 0; i < missing.size(); ++i) {
    std::fprintf(options.out, "  %s <- %s\n", std::string(missing[i].relative_path).c_str(),
                 urls[i].c_str());
    std::fflush(options.out);
    ASSIGN_OR_RETURN(
        const auto r,
        download_file(urls[i], dir, missing[i].relative_path, compiled_sha256(), DownloadOptions{}),
        "downloading dataset " + std::string(name));
    std::fprintf(options.out, "  %s: %lld bytes, sha256 ok\n", r.relative_path.c_str(),
                 static_cast<long long>(r.bytes));
  }
  return dir;
}

}  // namespace starling::fetch
