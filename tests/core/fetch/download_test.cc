// download_file against a loopback HTTP server: the file lands only when its hash matches, and
// every failure (wrong hash, 404, body cut short, stall, oversize) leaves nothing behind.
#include "core/fetch/download.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/fetch/sha256.h"
#include "core/fetch/verify.h"
#include "tests/core/fetch/loopback_http.h"

namespace fs = std::filesystem;
using starling::StatusCode;
using starling::fetch::DownloadOptions;
using starling::fetch::FileOutcome;
using starling::fetch::FileState;
using starling::fetch::HashTable;
using starling::testing::HttpRoute;
using starling::testing::LoopbackHttpServer;

namespace {

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("starling_fetch_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
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

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

// Every file under dir, as paths relative to it.
std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir).string());
  }
  return out;
}

std::string body_of(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) % 251);
  return s;
}

const std::string kRel = "set/file.bin";

}  // namespace

TEST_CASE("fetch: a download with the right hash lands the file", "[net]") {
  const size_t size = GENERATE(size_t{0}, size_t{1}, size_t{300000});
  const std::string body = body_of(size);
  LoopbackHttpServer server({{"/f", HttpRoute{200, body}}});
  TempDir dir;
  const HashTable table{{kRel, starling::fetch::sha256_hex(body)}};

  auto r = starling::fetch::download_file(server.url("/f"), dir.path() / "nested", kRel, table, {});
  REQUIRE(r.ok());
  CHECK(r->outcome == FileOutcome::kDownloaded);
  CHECK(r->bytes == static_cast<int64_t>(size));
  CHECK(r->sha256 == table.at(kRel));
  CHECK(r->url == server.url("/f"));
  CHECK(read_file(dir.path() / "nested" / kRel) == body);
  CHECK(files_under(dir.path()) == std::vector<std::string>{"nested/" + kRel});
  struct stat st {};
  REQUIRE(::stat((dir.path() / "nested" / kRel).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  CHECK(server.requests("/f") == 1);
  CHECK_FALSE(server.timed_out());
}

TEST_CASE("fetch: a wrong hash is an error naming file and hashes, and leaves nothing", "[net]") {
  const std::string body = body_of(5000);
  LoopbackHttpServer server({{"/f", HttpRoute{200, body}}});
  TempDir dir;
  const std::string wrong(64, 'a');
  const HashTable table{{kRel, wrong}};

  SECTION("no file before") {
    auto r = starling::fetch::download_file(server.url("/f"), dir.path(), kRel, table, {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    const std::string& m = r.status().message();
    CHECK_THAT(m, Catch::Contains(kRel));
    CHECK_THAT(m, Catch::Contains(wrong));
    CHECK_THAT(m, Catch::Contains(starling::fetch::sha256_hex(body)));
    CHECK_THAT(m, Catch::Contains(server.url("/f")));
    CHECK(files_under(dir.path()).empty());  // neither the file nor a temp file
  }
  SECTION("an existing file is left untouched") {
    write_file(dir.path() / kRel, "old contents");
    auto r = starling::fetch::download_file(server.url("/f"), dir.path(), kRel, table, {});
    REQUIRE_FALSE(r.ok());
    CHECK(read_file(dir.path() / kRel) == "old contents");
    CHECK(files_under(dir.path()) == std::vector<std::string>{kRel});
  }
}

TEST_CASE("fetch: HTTP errors name the URL and leave nothing", "[net]") {
  LoopbackHttpServer server({{"/gone", HttpRoute{410, "gone"}}});
  TempDir dir;
  const HashTable table{{kRel, std::string(64, '0')}};

  SECTION("404") {
    auto r = starling::fetch::download_file(server.url("/missing"), dir.path(), kRel, table, {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains(server.url("/missing")));
    CHECK_THAT(r.status().message(), Catch::Contains("404"));
    CHECK_THAT(r.status().message(), Catch::Contains(kRel));
  }
  SECTION("410") {
    auto r = starling::fetch::download_file(server.url("/gone"), dir.path(), kRel, table, {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(r.status().message(), Catch::Contains("HTTP 410"));
  }
  CHECK(files_under(dir.path()).empty());
}

TEST_CASE("fetch: a server closing mid-body is an error and leaves nothing", "[net]") {
  const std::string body = body_of(100000);
  HttpRoute cut{200, body};
  cut.cut_after = 40000;
  LoopbackHttpServer server({{"/cut", cut}});
  TempDir dir;
  // Even with the hash of the truncated prefix, a short body must not be accepted.
  const HashTable table{{kRel, starling::fetch::sha256_hex(body.substr(0, 40000))}};

  auto r = starling::fetch::download_file(server.url("/cut"), dir.path(), kRel, table, {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::Contains(server.url("/cut")));
  CHECK(files_under(dir.path()).empty());
}

TEST_CASE("fetch: a stalled transfer hits its time limit and leaves nothing", "[net]") {
  HttpRoute stall{200, body_of(1000)};
  stall.stall = true;
  LoopbackHttpServer server({{"/stall", stall}});
  TempDir dir;
  const HashTable table{{kRel, std::string(64, '0')}};
  DownloadOptions opts;
  opts.http.total_timeout = std::chrono::milliseconds(200);

  auto r = starling::fetch::download_file(server.url("/stall"), dir.path(), kRel, table, opts);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(files_under(dir.path()).empty());
}

TEST_CASE("fetch: the low-speed limit aborts a stalled transfer", "[net][slow]") {
  HttpRoute stall{200, body_of(1000)};
  stall.stall = true;
  LoopbackHttpServer server({{"/stall", stall}});
  TempDir dir;
  DownloadOptions opts;
  opts.http.low_speed_bytes = 1;
  opts.http.low_speed_time = std::chrono::seconds(1);

  auto r = starling::fetch::download_file(server.url("/stall"), dir.path(), kRel,
                                          {{kRel, std::string(64, '0')}}, opts);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(files_under(dir.path()).empty());
}

TEST_CASE("fetch: a body over the size limit is refused", "[net]") {
  const std::string body = body_of(70000);
  LoopbackHttpServer server({{"/big", HttpRoute{200, body}}});
  TempDir dir;
  DownloadOptions opts;
  opts.http.max_bytes = 65536;

  auto r = starling::fetch::download_file(server.url("/big"), dir.path(), kRel,
                                          {{kRel, starling::fetch::sha256_hex(body)}}, opts);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(files_under(dir.path()).empty());
}

TEST_CASE("fetch: a verified file is not downloaded again unless forced", "[net]") {
  const std::string body = body_of(2048);
  LoopbackHttpServer server({{"/f", HttpRoute{200, body}}});
  TempDir dir;
  const HashTable table{{kRel, starling::fetch::sha256_hex(body)}};
  const std::string url = server.url("/f");

  REQUIRE(starling::fetch::download_file(url, dir.path(), kRel, table, {}).ok());
  REQUIRE(server.requests("/f") == 1);

  auto again = starling::fetch::download_file(url, dir.path(), kRel, table, {});
  REQUIRE(again.ok());
  CHECK(again->outcome == FileOutcome::kAlreadyVerified);
  CHECK(again->bytes == 2048);
  CHECK(server.requests("/f") == 1);

  DownloadOptions force;
  force.force = true;
  auto forced = starling::fetch::download_file(url, dir.path(), kRel, table, force);
  REQUIRE(forced.ok());
  CHECK(forced->outcome == FileOutcome::kDownloaded);
  CHECK(server.requests("/f") == 2);

  SECTION("a corrupt file is replaced without --force") {
    write_file(dir.path() / kRel, "corrupt");
    auto fixed = starling::fetch::download_file(url, dir.path(), kRel, table, {});
    REQUIRE(fixed.ok());
    CHECK(fixed->outcome == FileOutcome::kDownloaded);
    CHECK(read_file(dir.path() / kRel) == body);
    CHECK(server.requests("/f") == 3);
  }
  CHECK(files_under(dir.path()) == std::vector<std::string>{kRel});
}

TEST_CASE("fetch: refuses a file with no expected hash and bad URLs, without a request", "[net]") {
  LoopbackHttpServer server({{"/f", HttpRoute{200, "x"}}});
  TempDir dir;

  auto r = starling::fetch::download_file(server.url("/f"), dir.path(), kRel, {}, {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(r.status().message(), Catch::Contains(kRel));

  auto ftp = starling::fetch::download_file("ftp://127.0.0.1/f", dir.path(), kRel,
                                            {{kRel, std::string(64, '0')}}, {});
  REQUIRE_FALSE(ftp.ok());
  CHECK(ftp.status().code() == StatusCode::kInvalidArgument);
  CHECK(server.requests("/f") == 0);
  CHECK(files_under(dir.path()).empty());
}

TEST_CASE("fetch: check_file reports verified, missing and corrupted files", "[net]") {
  TempDir dir;
  const std::string good = "good bytes", bad = "bad bytes";
  const HashTable table{{"a/good", starling::fetch::sha256_hex(good)},
                        {"a/bad", starling::fetch::sha256_hex(good)},
                        {"a/missing", starling::fetch::sha256_hex(good)}};
  write_file(dir.path() / "a/good", good);
  write_file(dir.path() / "a/bad", bad);
  write_file(dir.path() / "a/unlisted", good);

  const auto ok = starling::fetch::check_file(dir.path(), "a/good", table);
  CHECK(ok.state == FileState::kVerified);
  CHECK(ok.bytes == static_cast<int64_t>(good.size()));

  const auto corrupt = starling::fetch::check_file(dir.path(), "a/bad", table);
  CHECK(corrupt.state == FileState::kMismatch);
  CHECK(corrupt.expected == starling::fetch::sha256_hex(good));
  CHECK(corrupt.actual == starling::fetch::sha256_hex(bad));
  CHECK(starling::fetch::file_state_name(corrupt.state) == "MISMATCH");

  CHECK(starling::fetch::check_file(dir.path(), "a/missing", table).state == FileState::kMissing);
  CHECK(starling::fetch::check_file(dir.path(), "a/unlisted", table).state ==
        FileState::kNoExpectedHash);
}
