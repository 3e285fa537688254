// Secure aggregation in `starling simulate`: the same federation with and without [secagg] ends
// at the same model (up to the quantization), clients dropping after the share stage are
// unmasked around, a round the threshold cannot carry is retried with the model unchanged, and
// configs that cannot compose with secagg are refused naming the key.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "aggregator/fed_task.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/io/safetensors.h"
#include "sim/run.h"
#include "sim/secagg_round.h"

namespace starling::sim {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

bool have_mnist() {
  auto dir = data::resolve_data_dir("");
  std::error_code ec;
  return dir.ok() && fs::exists(*dir / "mnist/train-images-idx3-ubyte.gz", ec);
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("starling_secagg_sim_" + name);
  fs::remove_all(d);
  return d;
}

v1::FederationConfig tiny(bool secure) {
  v1::FederationConfig c;
  const Status st = config::parse_toml(R"(
[simulate]
mode = "IN_PROCESS"
workers = 2
progress = false
[data]
num_clients = 20
partition = "IID"
[model]
hidden = 16
[rounds]
num_rounds = 3
clients_per_round = 6
fraction = 0.0
[local]
local_steps = 20
batch_size = 20
learning_rate = 0.05
codec = "identity"
[eval]
max_examples = 500
[secagg]
clip_range = 1.0
quantization_levels = 1048575
modulus_bits = 32
error_feedback = false
)",
                                       "tiny", &c);
  REQUIRE(st.ok());
  c.mutable_secagg()->set_enabled(secure);
  return c;
}

RunOptions quiet(const fs::path& dir) {
  RunOptions o;
  o.out_dir = dir.string();
  o.progress = false;
  return o;
}

std::vector<float> weights(const fs::path& file) {
  auto st = io::load_safetensors(file);
  REQUIRE(st.ok());
  std::vector<float> all;
  for (const auto& [name, t] : st->tensors) {
    const auto v = t.to_float_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::vector<nlohmann::json> metrics(const fs::path& dir) {
  std::ifstream f(dir / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(f, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

}  // namespace

TEST_CASE("secagg: the federation ends at the model it reaches in the clear", "[sim][secagg]") {
  if (!have_mnist()) return;
  const fs::path a = fresh_dir("clear"), b = fresh_dir("masked");
  auto plain = run_simulation(tiny(false), "clear", quiet(a));
  REQUIRE(plain.ok());
  auto masked = run_simulation(tiny(true), "masked", quiet(b));
  INFO(masked.status().to_string());
  REQUIRE(masked.ok());
  const auto wa = weights(a / "model.safetensors"), wb = weights(b / "model.safetensors");
  REQUIRE(wa.size() == wb.size());
  double worst = 0;
  bool differs = false;
  for (size_t i = 0; i < wa.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(wa[i] - wb[i])));
    differs = differs || wa[i] != wb[i];
  }
  CHECK(worst < 1e-3);  // 2^20 levels over [-1, 1]: a step of 2e-6 per client and round
  CHECK(differs);       // but not the same bits: the sum went through the quantizer
  const auto rows = metrics(b);
  REQUIRE(rows.size() == 3);
  for (const auto& r : rows) {
    CHECK(r["updates"] == 6);
    CHECK(r["secagg_degree"] == 5);  // 6 clients: every other one
    CHECK(r["secagg_threshold"] == 4);
    CHECK(r["secagg_dropped"] == 0);
  }
  CHECK(std::abs(plain->final_accuracy - masked->final_accuracy) < 0.02);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE(
    "secagg: clients dropping after the share stage are unmasked around, and a round the "
    "threshold cannot carry is retried",
    "[sim][secagg]") {
  if (!have_mnist()) return;
  const fs::path d = fresh_dir("drop");
  auto c = tiny(true);
  c.mutable_rounds()->set_num_rounds(6);
  c.mutable_simulate()->set_dropout(0.25f);
  c.mutable_secagg()->set_error_feedback(true);
  auto r = run_simulation(c, "drop", quiet(d));
  INFO(r.status().to_string());
  REQUIRE(r.ok());
  int dropped = 0;
  for (const auto& row : metrics(d)) {
    dropped += row["secagg_dropped"].get<int>();
    CHECK(row["updates"].get<int>() + row["secagg_dropped"].get<int>() == 6);
  }
  CHECK(dropped > 0);
  CHECK(r->final_accuracy > 0.3);

  // Threshold 6 of 6: any dropout leaves too few shares; those rounds are retried.
  const fs::path e = fresh_dir("strict");
  c.mutable_secagg()->set_threshold(6);
  c.mutable_rounds()->set_num_rounds(3);
  auto s = run_simulation(c, "strict", quiet(e));
  INFO(s.status().to_string());
  REQUIRE(s.ok());
  int retried = 0;
  for (const auto& row : metrics(e)) {
    retried += row["attempts"].get<int>() - 1;
    CHECK(row["secagg_dropped"] == 0);
    CHECK(row["updates"] == 6);
  }
  CHECK(retried > 0);
  fs::remove_all(d);
  fs::remove_all(e);
}

TEST_CASE(
    "secagg with random-k: one draw of coordinates per round, error feedback or unbiased "
    "scaling",
    "[sim][secagg]") {
  const size_t n = 1000;
  const auto c = secagg::choose_coordinates(0.1, n, 42),
             again = secagg::choose_coordinates(0.1, n, 42);
  REQUIRE(c.sparse);
  REQUIRE(c.index.size() == 100);
  CHECK(c.index == again.index);  // every client of the round draws the same coordinates
  CHECK(secagg::choose_coordinates(0.1, n, 43).index != c.index);
  // Scaled values reach 10x the update's: the clip range must hold them.
  const secagg::Quantizer q{10.0, 1u << 20, 32};
  std::vector<float> delta(n), residual(n, 0.0f);
  Rng rng(1);
  for (auto& v : delta) v = static_cast<float>(0.1 * rng.normal());
  std::vector<uint32_t> out;
  // Error feedback: what was sent plus the residual is the update, on every coordinate.
  secagg::encode(q, c, delta, residual, rng, out);
  REQUIRE(out.size() == 100);
  std::vector<float> sent(out.size()), full(n);
  q.dequantize_sum(out, sent);
  secagg::scatter(c, sent, full);
  for (size_t i = 0; i < n; ++i) CHECK(full[i] + residual[i] == Approx(delta[i]).margin(1e-6));
  // Without it, each value is scaled by its stratum's size: unbiased over the draws.
  std::vector<double> mean(n, 0.0);
  const int draws = 3000;
  for (int d = 0; d < draws; ++d) {
    const auto cd = secagg::choose_coordinates(0.1, n, 1000 + d);
    secagg::encode(q, cd, delta, {}, rng, out);
    q.dequantize_sum(out, sent);
    secagg::scatter(cd, sent, full);
    for (size_t i = 0; i < n; ++i) mean[i] += full[i] / draws;
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(mean[i] - delta[i]));
  CHECK(worst < 0.05);  // 10 x 0.1 values, 3000 draws: a standard error near 0.006
}

TEST_CASE("secagg with random-k: a tenth of the bytes, and the model still learns",
          "[sim][secagg]") {
  if (!have_mnist()) return;
  const fs::path dense = fresh_dir("dense"), sparse = fresh_dir("randk");
  auto c = tiny(true);
  c.mutable_rounds()->set_num_rounds(6);
  c.mutable_secagg()->set_error_feedback(true);
  auto a = run_simulation(c, "dense", quiet(dense));
  REQUIRE(a.ok());
  c.mutable_local()->set_codec("randk:ratio=0.1");
  auto b = run_simulation(c, "randk", quiet(sparse));
  INFO(b.status().to_string());
  REQUIRE(b.ok());
  const auto ma = metrics(dense), mb = metrics(sparse);
  REQUIRE(ma.size() == mb.size());
  const double up_a = ma[0]["bytes_up"].get<double>(), up_b = mb[0]["bytes_up"].get<double>();
  CHECK(up_b < 0.2 * up_a);
  // A tenth of the coordinates a round: slower than dense, but the loss goes down.
  CHECK(mb.back()["train_loss"].get<double>() < mb.front()["train_loss"].get<double>());
  for (const auto& d : {dense, sparse}) fs::remove_all(d);
}

TEST_CASE("secagg with distributed DP: Poisson-sampled rounds, noisy sums, epsilon reported",
          "[sim][secagg]") {
  if (!have_mnist()) return;
  const fs::path d = fresh_dir("ddp");
  auto c = tiny(true);
  c.mutable_rounds()->set_num_rounds(4);
  c.mutable_secagg()->set_noise_multiplier(1.0f);
  c.mutable_secagg()->set_dp_clip_norm(0.5f);
  auto r = run_simulation(c, "ddp", quiet(d));
  INFO(r.status().to_string());
  REQUIRE(r.ok());
  double last = 0;
  std::set<int> sizes;
  for (const auto& row : metrics(d)) {
    const double eps = row["dp_epsilon"].get<double>();
    CHECK(eps > last);  // every round spends more
    last = eps;
    sizes.insert(row["selected"].get<int>());
  }
  CHECK(last < 50);
  CHECK(sizes.size() > 1);  // Poisson sampling: the number drawn varies
  // The noise is real: the model differs from the noiseless secure run's by far more than the
  // quantization does.
  const fs::path q = fresh_dir("ddp_quiet");
  auto quiet_cfg = c;
  quiet_cfg.mutable_secagg()->set_noise_multiplier(0.0f);
  REQUIRE(run_simulation(quiet_cfg, "quiet", quiet(q)).ok());
  const auto a = weights(d / "model.safetensors"), b = weights(q / "model.safetensors");
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  CHECK(diff > 1e-2);
  // Error feedback would carry clipped mass past the clip: refused by name.
  auto ef = c;
  ef.mutable_secagg()->set_error_feedback(true);
  CHECK_THAT(aggregator::validate_federation_config(ef, "t.toml").message(),
             Contains("key 'secagg.error_feedback'"));
  fs::remove_all(d);
  fs::remove_all(q);
}

TEST_CASE("secagg: configs it cannot compose with are refused naming the key", "[sim][secagg]") {
  auto topk = tiny(true);
  topk.mutable_local()->set_codec("topk:ratio=0.1");
  const Status st = aggregator::validate_federation_config(topk, "t.toml");
  CHECK_THAT(st.message(), Contains("key 'local.codec'") && Contains("per-client coordinates"));
  auto median = tiny(true);
  median.mutable_robust()->set_rule(v1::FedRobustConfig::MEDIAN);
  CHECK_THAT(aggregator::validate_federation_config(median, "t.toml").message(),
             Contains("key 'robust.rule'"));
  auto dp = tiny(true);
  dp.mutable_dp()->set_clip_norm(1.0f);
  CHECK_THAT(aggregator::validate_federation_config(dp, "t.toml").message(),
             Contains("key 'dp.clip_norm'"));
  auto wrap = tiny(true);
  wrap.mutable_secagg()->set_modulus_bits(16);
  CHECK_THAT(aggregator::validate_federation_config(wrap, "t.toml").message(),
             Contains("key 'secagg.modulus_bits'") && Contains("sum past the modulus"));
  auto bad_threshold = tiny(true);
  bad_threshold.mutable_secagg()->set_threshold(2);  // not a majority of 6 holders
  if (have_mnist()) {
    const fs::path d = fresh_dir("bad_threshold");
    auto r = run_simulation(bad_threshold, "bad", quiet(d));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Contains("secagg.threshold 2"));
    fs::remove_all(d);
  }
  auto timeout = tiny(true);
  timeout.mutable_secagg()->set_stage_timeout_ms(0);
  CHECK_THAT(aggregator::validate_federation_config(timeout, "t.toml").message(),
             Contains("key 'secagg.stage_timeout_ms'"));
}

TEST_CASE(
    "secagg over loopback TLS: the real aggregator and clients reach the model of the clear "
    "run, and distributed DP reports its epsilon",
    "[sim][secagg][net]") {
  if (!have_mnist()) return;
  auto loopback = [](bool secure) {
    auto c = tiny(secure);
    c.mutable_simulate()->set_mode(v1::FedSimulateConfig::LOOPBACK);
    c.mutable_data()->set_num_clients(8);
    return c;
  };
  const fs::path a = fresh_dir("net_clear"), b = fresh_dir("net_masked");
  auto plain = run_simulation(loopback(false), "clear", quiet(a));
  INFO(plain.status().to_string());
  REQUIRE(plain.ok());
  auto masked = run_simulation(loopback(true), "masked", quiet(b));
  INFO(masked.status().to_string());
  REQUIRE(masked.ok());
  const auto rows = metrics(b);
  REQUIRE(rows.size() == 3);
  for (const auto& r : rows) {
    CHECK(r["updates"] == 6);
    CHECK(r["secagg_degree"] == 5);
    CHECK(r["secagg_threshold"] == 4);
    CHECK(r["secagg_dropped"] == 0);
  }
  // Selection differs from the in-process engine's, not the arithmetic: within quantization of
  // the clear loopback run (FedAvg's weights are the examples; the secure mean is unweighted, and
  // IID partitions of equal size make them equal).
  const auto wa = weights(a / "model.safetensors"), wb = weights(b / "model.safetensors");
  REQUIRE(wa.size() == wb.size());
  double worst = 0;
  for (size_t i = 0; i < wa.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(wa[i] - wb[i])));
  CHECK(worst < 1e-3);
  CHECK(std::abs(plain->final_accuracy - masked->final_accuracy) < 0.02);

  const fs::path d = fresh_dir("net_ddp");
  auto ddp = loopback(true);
  ddp.mutable_secagg()->set_noise_multiplier(1.0f);
  ddp.mutable_secagg()->set_dp_clip_norm(0.5f);
  ddp.mutable_rounds()->set_clients_per_round(4);
  auto r = run_simulation(ddp, "ddp", quiet(d));
  INFO(r.status().to_string());
  REQUIRE(r.ok());
  double last = 0;
  for (const auto& row : metrics(d)) {
    const double eps = row["dp_epsilon"].get<double>();
    CHECK(eps > last);
    last = eps;
  }
  CHECK(last > 0);
  fs::remove_all(a);
  fs::remove_all(b);
  fs::remove_all(d);
}

}  // namespace starling::sim
