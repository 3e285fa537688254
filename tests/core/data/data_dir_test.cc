// Data folder resolution: explicit setting, environment variable, walk up, dataset names.
#include "core/data/data_dir.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "tests/testing/test_data.h"

namespace fs = std::filesystem;
using starling::StatusCode;
using starling::data::DataDirSearch;
using starling::data::resolve_data_dir;
using starling::data::resolve_dataset_file;

namespace {

// A fresh folder under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() /
            ("starling_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  static inline int next_ = 0;
  fs::path path_;
};

// Sets (or unsets, for nullopt) an environment variable for one scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("data dir: configured value and STARLING_DATA_DIR", "[data]") {
  TempDir a("cfg"), b("env");
  SECTION("configured wins over the environment") {
    ScopedEnv env("STARLING_DATA_DIR", b.path().string());
    auto dir = resolve_data_dir(a.path().string());
    REQUIRE(dir.ok());
    REQUIRE(*dir == a.path());
  }
  SECTION("environment when nothing is configured") {
    ScopedEnv env("STARLING_DATA_DIR", b.path().string());
    auto dir = resolve_data_dir("");
    REQUIRE(dir.ok());
    REQUIRE(*dir == b.path());
  }
  SECTION("an explicit setting that is not a directory is an error, not skipped") {
    const std::string missing = (a.path() / "nope").string();
    auto dir = resolve_data_dir(DataDirSearch{missing, b.path().string(), {}});
    REQUIRE_FALSE(dir.ok());
    REQUIRE(dir.status().code() == StatusCode::kNotFound);
    REQUIRE_THAT(dir.status().message(), Catch::Contains(missing));
    auto env_dir = resolve_data_dir(DataDirSearch{"", missing, {}});
    REQUIRE_FALSE(env_dir.ok());
    REQUIRE_THAT(env_dir.status().message(), Catch::Contains("STARLING_DATA_DIR"));
  }
}

TEST_CASE("data dir: walks up to shared/data", "[data]") {
  TempDir root("walk");
  fs::create_directories(root.path() / "shared" / "data");
  fs::create_directories(root.path() / "repo" / "build" / "tests");
  SECTION("beside the repository, from deep inside it") {
    auto dir = resolve_data_dir(DataDirSearch{"", "", {root.path() / "repo" / "build" / "tests"}});
    REQUIRE(dir.ok());
    REQUIRE(*dir == root.path() / "shared" / "data");
  }
  SECTION("inside the start folder itself") {
    auto dir = resolve_data_dir(DataDirSearch{"", "", {root.path()}});
    REQUIRE(dir.ok());
    REQUIRE(*dir == root.path() / "shared" / "data");
  }
  SECTION("later start folders are tried when the first finds nothing") {
    TempDir empty("walk_empty");
    auto dir = resolve_data_dir(DataDirSearch{"", "", {empty.path(), root.path() / "repo"}});
    REQUIRE(dir.ok());
    REQUIRE(*dir == root.path() / "shared" / "data");
  }
}

TEST_CASE("data dir: not found names what was tried and how to fix it", "[data]") {
  TempDir empty("none");
  fs::create_directories(empty.path() / "x");
  auto dir = resolve_data_dir(DataDirSearch{"", "", {empty.path() / "x"}});
  REQUIRE_FALSE(dir.ok());
  REQUIRE(dir.status().code() == StatusCode::kNotFound);
  const std::string& msg = dir.status().message();
  REQUIRE_THAT(msg, Catch::Contains((empty.path() / "x" / "shared" / "data").string()));
  REQUIRE_THAT(msg, Catch::Contains((empty.path() / "shared" / "data").string()));
  REQUIRE_THAT(msg, Catch::Contains("data_dir"));
  REQUIRE_THAT(msg, Catch::Contains("STARLING_DATA_DIR"));
  REQUIRE_THAT(msg, Catch::Contains("starling data download"));
}

TEST_CASE("data dir: the real shared/data and dataset names", "[data]") {
  auto dir = resolve_data_dir("");
  REQUIRE(dir.ok());
  SECTION("known names map to existing files") {
    auto ts = resolve_dataset_file(*dir, "tinyshakespeare");
    REQUIRE(ts.ok());
    REQUIRE(*ts == *dir / "tinyshakespeare" / "input.txt");
    for (std::string_view name : {"wikitext-2-valid", "wikitext-2-test", "ptb-valid", "ptb-test",
                                  "gpt2-encoder", "gpt2-merges", "mnist-train-images"}) {
      INFO(name);
      // The fixture cut (tests/testing/test_data.h) has WikiText-2's test split only, no PTB.
      if (starling::testing::using_fixture_data() &&
          (name == "wikitext-2-valid" || name.starts_with("ptb"))) {
        CHECK_FALSE(resolve_dataset_file(*dir, name).ok());
        continue;
      }
      REQUIRE(resolve_dataset_file(*dir, name).ok());
    }
  }
  SECTION("an unknown name lists the known ones") {
    auto f = resolve_dataset_file(*dir, "wikitext-103");
    REQUIRE(f.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(f.status().message(), Catch::Contains("wikitext-103"));
    REQUIRE_THAT(f.status().message(), Catch::Contains("tinyshakespeare"));
    REQUIRE_THAT(f.status().message(), Catch::Contains("ptb-valid"));
  }
  SECTION("a missing file is NotFound naming the path") {
    TempDir empty("nofile");
    auto f = resolve_dataset_file(empty.path(), "ptb-valid");
    REQUIRE(f.status().code() == StatusCode::kNotFound);
    REQUIRE_THAT(f.status().message(),
                 Catch::Contains((empty.path() / "ptb" / "ptb.valid.txt").string()));
  }
}
