// An update over 4 GiB crosses mutual TLS and is folded with peak RSS under 1 GiB for sender
// and receiver together (README: no size ceiling below the disk). STARLING_LARGE_UPDATE_MIB
// changes the size (the sanitizer job uses one just over the old 2 GiB protobuf limit).
#include "tests/testing/large_update.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

#include "tests/testing/tls_fixtures.h"

namespace starling::aggregator {
namespace {

TEST_CASE("an update over 4 GiB crosses TLS and folds in bounded memory", "[aggregator][large]") {
  uint64_t mib = 4200;  // 4.1 GiB
  if (const char* env = std::getenv("STARLING_LARGE_UPDATE_MIB"))
    mib = std::strtoull(env, nullptr, 10);
  const auto dir = std::filesystem::temp_directory_path();
  // The spill file and the sum file together take about twice the update on disk.
  const auto space = std::filesystem::space(dir);
  const uint64_t need = 2 * (mib << 20) + (1ull << 30);
  if (space.available < need) {
    FAIL("needs " << (need >> 20) << " MiB free in " << dir << ", has " << (space.available >> 20));
  }
  // fp32 for three quarters of the elements, fp16 for the rest: bytes = numel * 3.5.
  const auto numel = static_cast<int64_t>((mib << 20) * 2 / 7);
  testing::TestPki pki;
  const auto server = pki.issue("aggregator", net::CertRole::kServer);
  const auto client = pki.issue("client-1", net::CertRole::kClient);
  const auto run = testing::run_large_update(
      {pki.ca_pem(), server.cert_pem, server.key_pem, "", true},
      {pki.ca_pem(), client.cert_pem, client.key_pem, "", true}, numel, dir);
  REQUIRE(run.status.ok());
  INFO("moved " << run.payload_bytes << " bytes in " << run.transfer_seconds << " s, folded in "
                << run.fold_seconds << " s, peak RSS " << (run.peak_rss_bytes >> 20) << " MiB");
  CHECK(run.payload_bytes > (mib << 20) - (1u << 20));
  if (mib >= 4096) CHECK(run.payload_bytes > (4ull << 30));
  CHECK(run.mismatches == 0);
#if !defined(__SANITIZE_ADDRESS__)
  CHECK(run.peak_rss_bytes < (1ull << 30));
#endif
  WARN("large update: " << (run.payload_bytes >> 20) << " MiB, transfer " << run.transfer_seconds
                        << " s, fold " << run.fold_seconds << " s, peak RSS "
                        << (run.peak_rss_bytes >> 20) << " MiB");
}

}  // namespace
}  // namespace starling::aggregator
