// The one translation unit that holds Catch2's main(). Each test process works in a temporary
// folder of its own: TMPDIR points at a fresh $TMPDIR/starling_test.XXXXXX for the whole run
// (std::filesystem::temp_directory_path() and the children it starts follow it), removed when
// the run ends, passed or failed, so no test leaves a folder behind. Where no data directory is
// found (a bare clone: no $STARLING_DATA_DIR, no ../shared/data), STARLING_DATA_DIR points at the
// small cuts in tests/fixtures/data (tests/testing/test_data.h), so no test skips for want of data.
// STARLING_NO_DOWNLOAD=1: nothing the suite runs fetches a dataset.
#define CATCH_CONFIG_RUNNER
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/data/data_dir.h"

int main(int argc, char* argv[]) {
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  std::string templ =
      ((ec ? std::filesystem::path("/tmp") : base) / "starling_test.XXXXXX").string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::perror("catch_main: mkdtemp");
    return 2;
  }
  const std::filesystem::path own = buf.data();
  ::setenv("TMPDIR", own.c_str(), 1);
  // Tests never download: a command a test runs with a dataset missing fails, naming the file
  // (core/fetch/ensure.h); the download path itself is tested against a loopback server.
  ::setenv("STARLING_NO_DOWNLOAD", "1", 1);
  if (!starling::data::resolve_data_dir("").ok()) {
    ::setenv("STARLING_DATA_DIR", STARLING_SOURCE_DIR "/tests/fixtures/data", 1);
  }
  const int rc = Catch::Session().run(argc, argv);
  std::filesystem::remove_all(own, ec);
  return rc;
}
