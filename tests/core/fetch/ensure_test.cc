// A run's missing dataset is fetched (ensure_dataset) from a mirror on a loopback HTTP server,
// checked against the pinned SHA-256; nothing is fetched when it is present or downloads are
// off, and a wrong file from the mirror is refused.
#include "core/fetch/ensure.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/core/fetch/loopback_http.h"

namespace {

namespace fs = std::filesystem;
using starling::testing::HttpRoute;
using starling::testing::LoopbackHttpServer;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

fs::path fresh(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST_CASE("fetch: a run's missing dataset is downloaded from the mirror and checked", "[net]") {
  // The real Tiny Shakespeare (shipped in the fixtures) has the catalog's pinned hash.
  const std::string text =
      slurp(fs::path(STARLING_SOURCE_DIR) / "tests/fixtures/data/tinyshakespeare/input.txt");
  REQUIRE(text.size() > 1000000);
  LoopbackHttpServer server({{"/data/tinyshakespeare/input.txt", HttpRoute{200, text}}});
  const fs::path dir = fresh("ensure_data");
  std::FILE* out = std::tmpfile();
  starling::fetch::EnsureOptions o;
  o.url_override = server.url("/data/");
  o.out = out;
  // Downloads off: nothing fetched, nothing written.
  o.download = false;
  auto off = starling::fetch::ensure_dataset(dir.string(), "tinyshakespeare", o);
  REQUIRE(off.ok());
  CHECK(!fs::exists(dir / "tinyshakespeare" / "input.txt"));
  CHECK(server.requests("/data/tinyshakespeare/input.txt") == 0);
  // On: fetched, verified, and said.
  o.download = true;
  auto on = starling::fetch::ensure_dataset(dir.string(), "tinyshakespeare", o);
  REQUIRE(on.ok());
  CHECK(*on == fs::absolute(dir).lexically_normal());
  CHECK(slurp(dir / "tinyshakespeare" / "input.txt") == text);
  CHECK(server.requests("/data/tinyshakespeare/input.txt") == 1);
  std::rewind(out);
  std::string said(4096, '\0');
  said.resize(std::fread(said.data(), 1, said.size(), out));
  std::fclose(out);
  CHECK_THAT(said, Catch::Contains("dataset tinyshakespeare is not (all) in") &&
                       Catch::Contains("pinned SHA-256") && Catch::Contains("sha256 ok"));
  // Present: not fetched again; nor is a present file that differs (a cut of the data).
  o.out = stderr;
  REQUIRE(starling::fetch::ensure_dataset(dir.string(), "tinyshakespeare", o).ok());
  CHECK(server.requests("/data/tinyshakespeare/input.txt") == 1);
  std::ofstream(dir / "tinyshakespeare" / "input.txt") << "First Citizen:\nA cut.\n";
  REQUIRE(starling::fetch::ensure_dataset(dir.string(), "tinyshakespeare", o).ok());
  CHECK(server.requests("/data/tinyshakespeare/input.txt") == 1);
  CHECK(slurp(dir / "tinyshakespeare" / "input.txt") == "First Citizen:\nA cut.\n");
  // A mirror serving the wrong bytes: refused, nothing left.
  LoopbackHttpServer bad({{"/data/tinyshakespeare/input.txt", HttpRoute{200, "not it"}}});
  const fs::path dir2 = fresh("ensure_bad");
  o.url_override = bad.url("/data/");
  auto refused = starling::fetch::ensure_dataset(dir2.string(), "tinyshakespeare", o);
  REQUIRE(!refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("tinyshakespeare/input.txt"));
  CHECK(!fs::exists(dir2 / "tinyshakespeare" / "input.txt"));
}

TEST_CASE("fetch: config dataset names map to the catalog, the suite never downloads", "[net]") {
  CHECK(*starling::fetch::catalog_name_for("shakespeare") == "tinyshakespeare");
  CHECK(*starling::fetch::catalog_name_for("mnist") == "mnist");
  CHECK(*starling::fetch::catalog_name_for("fashion-mnist") == "fashion-mnist");
  CHECK(!starling::fetch::catalog_name_for("imagenet").ok());
  // catch_main turns downloads off for everything the suite runs.
  CHECK_FALSE(starling::fetch::ensure_options_from_env().download);
  ::setenv("STARLING_NO_DOWNLOAD", "0", 1);
  CHECK(starling::fetch::ensure_options_from_env().download);
  ::setenv("STARLING_NO_DOWNLOAD", "1", 1);
}

}  // namespace
