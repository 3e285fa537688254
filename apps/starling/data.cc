// `starling data list|verify|download`: the datasets of shared/data, checked against the SHA-256
// sums compiled into the binary, and fetched from their upstream sources for users without them.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apps/starling/commands.h"
#include "core/data/data_dir.h"
#include "core/fetch/catalog.h"
#include "core/fetch/download.h"
#include "core/fetch/verify.h"

namespace starling::apps {
namespace {

namespace fs = std::filesystem;

// Where `download` writes: --data-dir, else STARLING_DATA_DIR, else an existing data folder found
// the way training finds it, else ./shared/data (which that search then finds).
fs::path download_dir(const std::string& flag) {
  if (!flag.empty()) return fs::absolute(flag).lexically_normal();
  if (const char* env = std::getenv("STARLING_DATA_DIR"); env != nullptr && *env != '\0') {
    return fs::absolute(env).lexically_normal();
  }
  if (auto found = data::resolve_data_dir(""); found.ok()) return *found;
  return (fs::current_path() / "shared" / "data").lexically_normal();
}

std::vector<std::string_view> dataset_names() {
  std::vector<std::string_view> names;
  for (const auto& d : fetch::datasets()) names.push_back(d.name);
  return names;
}

void print_check(const fetch::FileCheck& c) {
  std::printf("  %-9s %s", std::string(fetch::file_state_name(c.state)).c_str(),
              c.relative_path.c_str());
  if (c.state == fetch::FileState::kVerified)
    std::printf(" (%lld bytes)", static_cast<long long>(c.bytes));
  if (c.state == fetch::FileState::kMismatch) {
    std::printf(": expected %s, got %s", c.expected.c_str(), c.actual.c_str());
  }
  if (c.state == fetch::FileState::kUnreadable) std::printf(": %s", c.detail.c_str());
  std::printf("\n");
}

void run_list(const std::string& flag) {
  auto dir = data::resolve_data_dir(flag);
  if (dir.ok()) {
    std::printf("data dir: %s\n", dir->c_str());
  } else {
    std::printf("data dir: none (%s)\n", dir.status().message().c_str());
  }
  for (const auto& d : fetch::datasets()) {
    std::printf("%s: %s\n", std::string(d.name).c_str(), std::string(d.description).c_str());
    for (const auto& f : d.files) {
      fetch::FileCheck c;
      c.relative_path = std::string(f.relative_path);
      if (dir.ok()) c = fetch::check_file(*dir, f.relative_path, fetch::compiled_sha256());
      print_check(c);
    }
  }
}

void run_verify(CommandContext& ctx, const std::string& flag, const std::string& name) {
  std::vector<fetch::CatalogFile> files;
  if (name.empty()) {
    for (const auto& d : fetch::datasets())
      files.insert(files.end(), d.files.begin(), d.files.end());
  } else {
    auto selected = fetch::select_files(name);
    if (!selected.ok()) return fail(ctx, selected.status().message());
    files = std::move(*selected);
  }
  auto dir = data::resolve_data_dir(flag);
  if (!dir.ok()) return fail(ctx, dir.status().message());
  std::printf("data dir: %s\n", dir->c_str());
  int verified = 0, missing = 0, bad = 0;
  for (const auto& f : files) {
    const auto c = fetch::check_file(*dir, f.relative_path, fetch::compiled_sha256());
    if (c.state == fetch::FileState::kMissing) {
      ++missing;
      continue;
    }
    print_check(c);
    if (c.state == fetch::FileState::kVerified) {
      ++verified;
    } else {
      ++bad;
    }
  }
  std::printf("%d verified, %d failed, %d not present\n", verified, bad, missing);
  const std::string what = name.empty() ? "dataset" : "'" + name + "'";
  const std::string arg = name.empty() ? "NAME" : name;
  if (bad > 0) {
    return fail(ctx, std::to_string(bad) + " file(s) failed SHA-256 verification in " +
                         dir->string() + "; `starling data download " + arg + "` replaces them");
  }
  if (verified == 0) {
    return fail(ctx, "no " + what + " files in " + dir->string() +
                         "; run `starling data download " + arg + "`");
  }
}

struct DownloadArgs {
  std::string name;
  std::string data_dir;
  std::string url;
  bool force = false;
};

void run_download(CommandContext& ctx, const DownloadArgs& a) {
  auto files = fetch::select_files(a.name);
  if (!files.ok()) return fail(ctx, files.status().message());
  auto urls = fetch::resolve_urls(*files, a.url);
  if (!urls.ok()) return fail(ctx, urls.status().message());
  const fs::path dir = download_dir(a.data_dir);
  std::printf("data dir: %s\n", dir.c_str());
  fetch::DownloadOptions options;
  options.force = a.force;
  for (size_t i = 0; i < files->size(); ++i) {
    const auto& f = (*files)[i];
    if (!a.force) {
      const auto c = fetch::check_file(dir, f.relative_path, fetch::compiled_sha256());
      if (c.state == fetch::FileState::kVerified) {
        std::printf("%s: already present, sha256 ok (--force downloads it again)\n",
                    c.relative_path.c_str());
        continue;
      }
    }
    std::printf("%s: fetching %s\n", std::string(f.relative_path).c_str(), (*urls)[i].c_str());
    std::fflush(stdout);
    auto r =
        fetch::download_file((*urls)[i], dir, f.relative_path, fetch::compiled_sha256(), options);
    if (!r.ok()) {
      fail(ctx, r.status().message());
      continue;
    }
    if (r->outcome == fetch::FileOutcome::kAlreadyVerified) {
      std::printf("%s: already present, sha256 ok (--force downloads it again)\n",
                  r->relative_path.c_str());
    } else {
      std::printf("%s: downloaded %lld bytes, sha256 ok\n", r->relative_path.c_str(),
                  static_cast<long long>(r->bytes));
    }
  }
}

}  // namespace

void register_data(CLI::App& app, CommandContext& ctx) {
  CLI::App* data = app.add_subcommand("data", "List, verify and download the datasets");
  data->require_subcommand(1);
  std::string names;
  for (const auto n : dataset_names()) names += (names.empty() ? "" : ", ") + std::string(n);

  auto list_dir = std::make_shared<std::string>();
  CLI::App* list = data->add_subcommand(
      "list", "Every dataset, its files, and whether each is present and verified");
  list->add_option("--data-dir", *list_dir, "Data directory (default: found as for training)");
  list->callback([list_dir] { run_list(*list_dir); });

  auto verify_dir = std::make_shared<std::string>();
  auto verify_name = std::make_shared<std::string>();
  CLI::App* verify = data->add_subcommand(
      "verify", "Check the SHA-256 of the dataset files present against the expected sums");
  verify->add_option("name", *verify_name, "Dataset (" + names + ") or file; default: all");
  verify->add_option("--data-dir", *verify_dir, "Data directory (default: found as for training)");
  verify->callback([&ctx, verify_dir, verify_name] { run_verify(ctx, *verify_dir, *verify_name); });

  auto args = std::make_shared<DownloadArgs>();
  CLI::App* dl = data->add_subcommand(
      "download",
      "Fetch a dataset from its upstream source; install each file only if its "
      "SHA-256 matches");
  dl->add_option("name", args->name, "Dataset (" + names + ") or one file (e.g. mnist-test-labels)")
      ->required();
  dl->add_option("--data-dir", args->data_dir,
                 "Where to write (default: STARLING_DATA_DIR, else the data directory found as "
                 "for training, else ./shared/data)");
  dl->add_option("--url", args->url,
                 "Fetch from here instead of upstream: the file's URL (one file), or a mirror "
                 "base ending in '/' (URL + relative path, e.g. URL/mnist/...)");
  dl->add_flag("--force", args->force, "Download again even when a verified copy is present");
  dl->callback([&ctx, args] { run_download(ctx, *args); });
}

}  // namespace starling::apps
