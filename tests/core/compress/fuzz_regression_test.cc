// Inputs found by the libFuzzer targets in fuzz/, kept as regression tests.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/compress/codec.h"

TEST_CASE("fuzz: an empty random-k segment decodes to nothing instead of dividing by zero",
          "[compress]") {
  const std::string bytes("\x12\x02\x08\x07", 4);  // codec_fuzz crash-1e8012f7
  auto update = starling::compress::parse_update(bytes);
  REQUIRE(update.ok());
  std::vector<float> dst(static_cast<size_t>(update->numel), 1.0f);
  const auto st = starling::compress::decode_add(*update, dst, 0.5f);
  // Either a clean rejection or a no-op: never a crash.
  if (st.ok()) {
    for (float v : dst) REQUIRE(v == 1.0f);
  }
}
