// Which datasets the tests see. With ../shared/data (or $STARLING_DATA_DIR) the real ones; on a
// bare clone catch_main.cc points STARLING_DATA_DIR at tests/fixtures/data, the small cuts that
// ship in the repository (MNIST 3,000/500, Fashion-MNIST 1,000/200, all of Tiny Shakespeare and
// GPT-2's BPE files). Tests of properties of the full datasets check the cut's figures there.
// Header-only: link starling_core_data.
#pragma once

#include <filesystem>
#include <system_error>

#include "core/data/data_dir.h"

namespace starling::testing {

inline bool using_fixture_data() {
  auto dir = data::resolve_data_dir("");
  std::error_code ec;
  return dir.ok() &&
         std::filesystem::equivalent(
             *dir, std::filesystem::path(STARLING_SOURCE_DIR) / "tests" / "fixtures" / "data", ec);
}

}  // namespace starling::testing
