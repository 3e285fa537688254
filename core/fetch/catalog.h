// The downloadable datasets: their files, canonical upstream URLs and the SHA-256 of every file.
// The hash table compiled in here is the same as shared/data/SHA256SUMS (a test keeps them equal).
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::fetch {

// One file of a dataset.
struct CatalogFile {
  std::string_view name;           // the name core/data/data_dir.cc knows it by, e.g. "ptb-test"
  std::string_view relative_path;  // under the data folder, e.g. "ptb/ptb.test.txt"
  std::string_view url;            // canonical upstream source, commit-pinned where one exists
};

// A user-facing dataset: a group of files downloaded together.
struct CatalogDataset {
  std::string_view name;  // "tinyshakespeare", "mnist", ..., "gpt2", "gpt2-124m"
  std::string_view description;
  std::span<const CatalogFile> files;
  // Pretrained weights ("gpt2-124m"): downloaded on request only, not part of shared/data, and
  // the folder under the data dir is what `[model] init_from = "hf:NAME"` names.
  bool pretrained_model = false;
};

// Relative path -> lowercase hex SHA-256.
using HashTable = std::map<std::string, std::string, std::less<>>;

// Every dataset, in a fixed order.
std::span<const CatalogDataset> datasets();

// The files selected by `name`: every file of a dataset ("mnist"), or one file by its data_dir
// name ("mnist-train-images"). Errors: InvalidArgument for an unknown name, listing the known ones.
Result<std::vector<CatalogFile>> select_files(std::string_view name);

// The pretrained model `name` ("gpt2-124m"), or null when no such model is in the catalog.
const CatalogDataset* find_pretrained_model(std::string_view name);

// The expected SHA-256 of every catalog file, compiled into the binary.
const HashTable& compiled_sha256();

// Parses `sha256sum` output ("<64 hex>  <path>" per line, "*" binary marker allowed, blank lines
// skipped). Errors: InvalidArgument naming the bad line.
Result<HashTable> parse_sha256sums(std::string_view text);

}  // namespace starling::fetch
