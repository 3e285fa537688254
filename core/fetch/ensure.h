// A run that needs a dataset its data folder lacks fetches it (canonical source, pinned
// SHA-256, as `starling data download` does) and says so, unless downloads are turned off:
// STARLING_NO_DOWNLOAD=1 in the environment (the test suite sets it: tests never download).
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace starling::fetch {

struct EnsureOptions {
  bool download = true;      // false: report nothing missing, fetch nothing
  std::string url_override;  // a mirror laid out like the data folder ("http://host/data/")
  std::FILE* out = stderr;   // where each step is said
};

// Whether the environment allows downloads (STARLING_NO_DOWNLOAD unset, empty or "0"), and
// STARLING_DATA_MIRROR as the mirror.
EnsureOptions ensure_options_from_env();

// The catalog dataset holding the data-folder file `data_name` ("mnist", "tinyshakespeare",
// "wikitext-2-valid", ...), or the config dataset names "shakespeare" (Tiny Shakespeare).
// NotFound for a name the catalog lacks.
Result<std::string> catalog_name_for(std::string_view data_name);

// Makes every file of catalog dataset `name` present in the data folder `configured` would
// resolve to (data::resolve_data_dir; with none found: ./shared/data, which that search then
// finds). Files present are left alone (never replaced: `starling data verify` checks them);
// missing ones are fetched when options.download, each checked against its pinned SHA-256,
// saying so on options.out. Returns the folder. Errors: those of
// download_file (each naming the file and URL); none when downloads are off (the loader's own
// error then names the missing file).
Result<std::filesystem::path> ensure_dataset(const std::string& configured, std::string_view name,
                                             const EnsureOptions& options);

}  // namespace starling::fetch
