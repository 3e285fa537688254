// Every configs/fed_*.toml loads and validates; bad values and unknown keys are errors.
#include <catch2/catch.hpp>
#include <filesystem>

#include "aggregator/fed_task.h"
#include "core/config/toml_config.h"

namespace starling::aggregator {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

TEST_CASE("every federation config in configs/ loads", "[aggregator]") {
  int found = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(STARLING_SOURCE_DIR) / "configs")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("fed_", 0) != 0 || entry.path().extension() != ".toml") continue;
    ++found;
    INFO(name);
    auto c = load_federation_config(entry.path());
    REQUIRE(c.ok());
    const auto o = aggregator_options(*c);
    CHECK(o.num_rounds == c->rounds().num_rounds());
    CHECK(compress::parse_compression_spec(o.codec).ok());
  }
  CHECK(found >= 3);
}

TEST_CASE("the IID config is McMahan's setting", "[aggregator]") {
  auto c = load_federation_config(fs::path(STARLING_SOURCE_DIR) / "configs/fed_mnist_2nn_iid.toml");
  REQUIRE(c.ok());
  CHECK(c->data().num_clients() == 100);
  CHECK(c->rounds().fraction() == Approx(0.1));
  CHECK(c->local().epochs() == 1);
  CHECK(c->local().batch_size() == 10);
  CHECK(c->model().hidden() == 200);
  CHECK(c->data().partition() == v1::FedDataConfig::IID);
}

TEST_CASE("bad federation configs name the key", "[aggregator]") {
  v1::FederationConfig c;
  REQUIRE(config::parse_toml("[rounds]\nfraction = 1.5\n[local]\ncodec = \"zip\"\n", "x.toml", &c)
              .ok());
  const Status st = validate_federation_config(c, "x.toml");
  CHECK_THAT(st.message(), Contains("rounds.fraction") && Contains("local.codec"));
  v1::FederationConfig d;
  const Status unknown = config::parse_toml("[rounds]\nfractoin = 0.5\n", "y.toml", &d);
  CHECK_THAT(unknown.message(), Contains("y.toml:2") && Contains("fraction"));
}

}  // namespace
}  // namespace starling::aggregator
