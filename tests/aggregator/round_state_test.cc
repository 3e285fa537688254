// Crash-safe round state: round trip, missing state, corruption detected by the checksum.
#include "aggregator/round_state.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>

namespace starling::aggregator {
namespace {

namespace fs = std::filesystem;

TEST_CASE("round state survives a save and load, corruption is detected", "[aggregator]") {
  const fs::path dir = fs::temp_directory_path() / ("starling_rs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const compress::Layout layout = {{"a", {2, 2}, 0}, {"b", {3}, 4}};
  CHECK(load_round_state(dir, layout).status().code() == StatusCode::kNotFound);

  RoundState st;
  st.round = 7;
  st.model_version = 7;
  st.strategy = "fedadam";
  st.global = {1, 2, 3, 4, 5, 6, 7};
  st.slots = {{"m", std::vector<float>(7, 0.5f)}, {"v", std::vector<float>(7, 0.25f)}};
  REQUIRE(save_round_state(dir, layout, st).ok());
  CHECK(fs::exists(dir / kModelFile));

  auto back = load_round_state(dir, layout);
  REQUIRE(back.ok());
  CHECK(back->round == 7);
  CHECK(back->strategy == "fedadam");
  CHECK(back->global == st.global);
  REQUIRE(back->slots.size() == 2);
  CHECK(back->slots[1].first == "v");
  CHECK(back->slots[1].second == st.slots[1].second);
  CHECK(back->dp_rdp.empty());

  // The DP accountant's RDP curve travels in the metadata, exactly.
  st.dp_rdp = {0.1, 1.0 / 3.0, 2.5e-7, std::numeric_limits<double>::infinity()};
  REQUIRE(save_round_state(dir, layout, st).ok());
  auto with_dp = load_round_state(dir, layout);
  REQUIRE(with_dp.ok());
  CHECK(with_dp->dp_rdp == st.dp_rdp);

  const compress::Layout other = {{"a", {4}, 0}, {"b", {3}, 4}};
  CHECK(load_round_state(dir, other).status().code() == StatusCode::kInvalidArgument);

  {  // flip one byte of tensor data (the file ends with tensor bytes)
    std::fstream f(dir / kStateFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  CHECK(load_round_state(dir, layout).status().code() == StatusCode::kDataLoss);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::aggregator
