// Virtual clients' state: error feedback on an external residual matches compress::ErrorFeedback
// bit for bit; the residual store keeps residuals exactly, in memory or spilled to disk.
#include "sim/client_state.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/util/rng.h"

namespace starling::sim {
namespace {

namespace fs = std::filesystem;

compress::Layout layout() { return {{"w", {40, 10}, 0}, {"b", {10}, 400}, {"v", {90}, 410}}; }

std::vector<float> delta(uint64_t seed) {
  Rng rng(seed);
  std::vector<float> d(500);
  for (auto& x : d) x = static_cast<float>(rng.normal());
  return d;
}

TEST_CASE("ClientCodec equals ErrorFeedback round after round", "[sim]") {
  const auto spec = GENERATE(std::string("topk:ratio=0.05,ef=1;b=identity"),
                             std::string("int8:block=64,ef=1"), std::string("topk:ratio=0.1"));
  INFO(spec);
  auto reference = compress::make_codec(spec, layout(), 9);
  REQUIRE(reference.ok());
  auto ours = ClientCodec::create(spec, layout(), 9);
  REQUIRE(ours.ok());
  CHECK(ours->uses_residual() == (spec.find("ef=1") != std::string::npos));
  std::vector<float> residual;
  compress::EncodedUpdate a, b;
  for (uint64_t round = 1; round <= 4; ++round) {
    const auto d = delta(round);
    REQUIRE((*reference)->encode_into(d, a).ok());
    REQUIRE(ours->encode(d, residual, b).ok());
    CHECK(compress::serialize_update(a) == compress::serialize_update(b));
  }
  if (auto* ef = dynamic_cast<compress::ErrorFeedback*>(reference->get())) {
    CHECK(std::vector<float>(ef->residual().begin(), ef->residual().end()) == residual);
  } else {
    CHECK(residual.empty());
  }
  std::vector<float> wrong(3, 0.0f);
  if (ours->uses_residual()) CHECK_FALSE(ours->encode(delta(1), wrong, b).ok());
  CHECK_FALSE(ClientCodec::create("zip", layout(), 1).ok());
}

TEST_CASE("residuals live in memory up to the budget and on disk beyond it", "[sim]") {
  const fs::path dir = fs::temp_directory_path() / "starling_residual_store_test";
  fs::remove_all(dir);
  {
    ResidualStore store(dir, 2 * 500 * sizeof(float));  // room for two in memory
    for (int k = 0; k < 5; ++k) REQUIRE(store.put(k, delta(static_cast<uint64_t>(k))).ok());
    REQUIRE(store.put(9, {}).ok());  // nothing to keep
    auto s = store.stats();
    CHECK(s.clients == 5);
    CHECK(s.memory_bytes == 4000);
    CHECK(s.disk_bytes == 6000);
    CHECK(fs::exists(dir / "client-4.f32"));
    for (int k : {4, 0, 2}) {
      auto r = store.take(k);
      REQUIRE(r.ok());
      CHECK(*r == delta(static_cast<uint64_t>(k)));
    }
    CHECK_FALSE(fs::exists(dir / "client-4.f32"));
    auto none = store.take(9);
    REQUIRE(none.ok());
    CHECK(none->empty());
    CHECK(store.stats().clients == 2);
    CHECK(store.stats().peak_disk_bytes == 6000);
    // A spilled residual cut short on disk is an error naming the file.
    { std::ofstream(dir / "client-3.f32", std::ios::trunc) << "abc"; }
    auto bad = store.take(3);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(bad.status().message(), Catch::Contains("client-3.f32"));
  }
  CHECK(fs::is_empty(dir));  // the store removes what it spilled
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::sim
