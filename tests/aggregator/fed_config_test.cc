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

TEST_CASE("the IID and shards configs are McMahan's settings", "[aggregator]") {
  auto c = load_federation_config(fs::path(STARLING_SOURCE_DIR) / "configs/fed_mnist_2nn_iid.toml");
  REQUIRE(c.ok());
  CHECK(c->data().num_clients() == 100);
  CHECK(c->rounds().fraction() == Approx(0.1));
  CHECK(c->local().epochs() == 1);
  CHECK(c->local().batch_size() == 10);
  CHECK(c->model().hidden() == 200);
  CHECK(c->data().partition() == v1::FedDataConfig::IID);
  CHECK(c->local().learning_rate() == Approx(0.05));
  CHECK(c->model().init() == v1::FedModelConfig::TRUNCATED_NORMAL);
  auto s =
      load_federation_config(fs::path(STARLING_SOURCE_DIR) / "configs/fed_mnist_2nn_shards.toml");
  REQUIRE(s.ok());
  CHECK(s->data().partition() == v1::FedDataConfig::SHARDS);
  CHECK(s->data().shards_per_client() == 2);
  CHECK(s->local().learning_rate() == Approx(0.05));
  CHECK(s->model().init() == v1::FedModelConfig::TRUNCATED_NORMAL);
}

TEST_CASE("bad federation configs name the key", "[aggregator]") {
  v1::FederationConfig c;
  REQUIRE(config::parse_toml(
              "[server]\nupload_stall_seconds = 0\n[rounds]\nfraction = 1.5\n[local]\ncodec = "
              "\"zip\"\n[model]\ninit_std = 0\ninit_bias = nan\n",
              "x.toml", &c)
              .ok());
  const Status st = validate_federation_config(c, "x.toml");
  CHECK_THAT(st.message(), Contains("rounds.fraction") && Contains("local.codec") &&
                               Contains("server.upload_stall_seconds") &&
                               Contains("model.init_std") && Contains("model.init_bias"));
  v1::FederationConfig d;
  const Status unknown = config::parse_toml("[rounds]\nfractoin = 0.5\n", "y.toml", &d);
  CHECK_THAT(unknown.message(), Contains("y.toml:2") && Contains("fraction"));
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

TEST_CASE("Krum, DP and metrics keys reach the aggregator options", "[aggregator]") {
  v1::FederationConfig c;
  REQUIRE(config::parse_toml(R"([server]
metrics_port = 9464
upload_memory_mb = 8
spill_dir = "/tmp/spill"
download_window_kb = 64
upload_stall_seconds = 5
[rounds]
clients_per_round = 7
min_available = 7
min_updates = 7
[robust]
rule = "MULTI_KRUM"
byzantine_f = 2
krum_m = 3
)",
                             "k.toml", &c)
              .ok());
  REQUIRE(validate_federation_config(c, "k.toml").ok());
  auto o = aggregator_options(c);
  CHECK(o.rule.rule == RobustRule::kMultiKrum);
  CHECK(o.rule.byzantine_f == 2);
  CHECK(o.rule.krum_m == 3);
  CHECK(o.upload_memory_bytes == 8u << 20);
  CHECK(o.spill_dir == "/tmp/spill");
  CHECK(o.download_window_bytes == 64u << 10);
  CHECK(o.upload_stall_timeout == std::chrono::seconds(5));
  CHECK_FALSE(o.dp.enabled());

  v1::FederationConfig d;
  REQUIRE(config::parse_toml("[dp]\nclip_norm = 0.5\nnoise_multiplier = 1.2\ndelta = 1e-6\n"
                             "simulation_seed = 9\n",
                             "d.toml", &d)
              .ok());
  REQUIRE(validate_federation_config(d, "d.toml").ok());
  o = aggregator_options(d);
  CHECK(o.dp.enabled());
  CHECK(o.dp.clip_norm == Approx(0.5));
  CHECK(o.dp.noise_multiplier == Approx(1.2));
  CHECK(o.dp.delta == 1e-6);
  CHECK(o.dp.simulation_seed == 9);
  // The old key, which made the noise recomputable from the config, is gone: a clear error.
  v1::FederationConfig old;
  const Status st = config::parse_toml("[dp]\nclip_norm = 0.5\nseed = 9\n", "old.toml", &old);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("old.toml:3") && Catch::Contains("seed"));
}

TEST_CASE("Krum and DP misconfigurations name the key", "[aggregator]") {
  v1::FederationConfig c;
  REQUIRE(config::parse_toml("[rounds]\nclients_per_round = 4\nmin_available = 4\n"
                             "min_updates = 4\n[robust]\nrule = \"KRUM\"\nbyzantine_f = 1\n"
                             "krum_m = 2\n",
                             "k.toml", &c)
              .ok());
  Status st = validate_federation_config(c, "k.toml");
  CHECK_THAT(st.message(), Contains("'rounds.min_updates' must be at least 2 * robust.byzantine_f "
                                    "+ 3 = 5") &&
                               Contains("rounds.min_available") &&
                               Contains("rounds.clients_per_round") &&
                               Contains("'robust.krum_m' applies to MULTI_KRUM only"));
  v1::FederationConfig d;
  REQUIRE(config::parse_toml("[dp]\nclip_norm = 1.0\ndelta = 2.0\nnoise_multiplier = -1\n"
                             "[robust]\nrule = \"MEDIAN\"\n[rounds]\nbuffer_size = 4\n",
                             "d.toml", &d)
              .ok());
  st = validate_federation_config(d, "d.toml");
  CHECK_THAT(st.message(),
             Contains("d.toml: key 'dp.delta'") && Contains("'dp.noise_multiplier'") &&
                 Contains("needs robust.rule MEAN") && Contains("synchronous rounds"));
  v1::FederationConfig m;
  REQUIRE(
      config::parse_toml("[server]\nmetrics_port = 70000\ndownload_window_kb = 0\n", "m.toml", &m)
          .ok());
  CHECK_THAT(validate_federation_config(m, "m.toml").message(),
             Contains("server.metrics_port") && Contains("server.download_window_kb"));
}

}  // namespace
}  // namespace starling::aggregator
