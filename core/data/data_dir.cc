// Data folder resolution: explicit setting, then environment, then a walk up the folder tree.
#include "core/data/data_dir.h"

#include <array>
#include <cstdlib>
#include <system_error>
#include <utility>

namespace starling::data {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEnvVar = "STARLING_DATA_DIR";

struct DatasetEntry {
  std::string_view name;
  std::string_view relative_path;
};

constexpr std::array<DatasetEntry, 15> kDatasets = {{
    {"tinyshakespeare", "tinyshakespeare/input.txt"},
    {"wikitext-2-valid", "wikitext-2/wiki.valid.tokens"},
    {"wikitext-2-test", "wikitext-2/wiki.test.tokens"},
    {"ptb-valid", "ptb/ptb.valid.txt"},
    {"ptb-test", "ptb/ptb.test.txt"},
    {"gpt2-encoder", "gpt2/encoder.json"},
    {"gpt2-merges", "gpt2/vocab.bpe"},
    {"mnist-train-images", "mnist/train-images-idx3-ubyte.gz"},
    {"mnist-train-labels", "mnist/train-labels-idx1-ubyte.gz"},
    {"mnist-test-images", "mnist/t10k-images-idx3-ubyte.gz"},
    {"mnist-test-labels", "mnist/t10k-labels-idx1-ubyte.gz"},
    {"fashion-mnist-train-images", "fashion-mnist/train-images-idx3-ubyte.gz"},
    {"fashion-mnist-train-labels", "fashion-mnist/train-labels-idx1-ubyte.gz"},
    {"fashion-mnist-test-images", "fashion-mnist/t10k-images-idx3-ubyte.gz"},
    {"fashion-mnist-test-labels", "fashion-mnist/t10k-labels-idx1-ubyte.gz"},
}};

constexpr std::array<std::string_view, kDatasets.size()> kNames = [] {
  std::array<std::string_view, kDatasets.size()> names{};
  for (size_t i = 0; i < kDatasets.size(); ++i) names[i] = kDatasets[i].name;
  return names;
}();

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

fs::path absolute_normal(const fs::path& p) {
  std::error_code ec;
  fs::path a = fs::absolute(p, ec);
  if (ec) a = p;
  return a.lexically_normal();
}

Result<fs::path> explicit_dir(const std::string& value, std::string_view source) {
  const fs::path p = absolute_normal(value);
  if (!is_dir(p)) {
    return not_found(std::string(source) + " is '" + value + "', which is not a directory (" +
                     p.string() + ")");
  }
  return p;
}

}  // namespace

Result<fs::path> resolve_data_dir(const DataDirSearch& search) {
  if (!search.configured.empty()) return explicit_dir(search.configured, "data_dir");
  if (!search.env_value.empty()) return explicit_dir(search.env_value, kEnvVar);

  std::vector<fs::path> tried;
  auto try_candidate = [&](const fs::path& candidate) -> bool {
    const fs::path c = candidate.lexically_normal();
    for (const auto& t : tried) {
      if (t == c) return false;
    }
    tried.push_back(c);
    return is_dir(c);
  };
  for (const auto& start : search.start_dirs) {
    if (start.empty()) continue;
    fs::path dir = absolute_normal(start);
    while (true) {
      if (try_candidate(dir / "shared" / "data")) return tried.back();
      if (try_candidate(dir / ".." / "shared" / "data")) return tried.back();
      const fs::path parent = dir.parent_path();
      if (parent == dir || parent.empty()) break;
      dir = parent;
    }
  }
  std::string msg = "no data directory found; tried:";
  for (const auto& t : tried) msg += " " + t.string();
  if (tried.empty()) msg += " (nothing: no start folder)";
  msg += ". Set data_dir in the config or the environment variable ";
  msg += kEnvVar;
  msg += ", or run `starling data download NAME`";
  return not_found(std::move(msg));
}

Result<fs::path> resolve_data_dir(const std::string& configured) {
  DataDirSearch search;
  search.configured = configured;
  if (const char* env = std::getenv(std::string(kEnvVar).c_str()); env != nullptr) {
    search.env_value = env;
  }
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) search.start_dirs.push_back(cwd);
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) search.start_dirs.push_back(exe.parent_path());
  return resolve_data_dir(search);
}

std::span<const std::string_view> known_dataset_names() { return kNames; }

Result<fs::path> resolve_dataset_file(const fs::path& data_dir, std::string_view dataset_name) {
  for (const auto& entry : kDatasets) {
    if (entry.name != dataset_name) continue;
    fs::path file = data_dir / fs::path(entry.relative_path);
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      return not_found("dataset '" + std::string(dataset_name) +
                       "': file not found: " + file.string() + " (run `starling data download " +
                       std::string(dataset_name) + "`)");
    }
    return file;
  }
  std::string msg = "unknown dataset '" + std::string(dataset_name) + "'; known:";
  for (const auto& name : kNames) {
    msg += " ";
    msg += name;
  }
  return invalid_argument(std::move(msg));
}

}  // namespace starling::data
