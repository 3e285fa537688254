// Whole simulations on tiny configs: same seed gives identical metrics files (whatever the
// worker count or where residuals live), emulation shows in the records, the report renders its
// series, loopback TLS runs the real aggregator, sweeps compare, every sim config loads.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "aggregator/fed_task.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/io/safetensors.h"
#include "models/gpt/checkpoint.h"
#include "sim/run.h"

namespace starling::sim {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

bool have_data(const char* file) {
  auto dir = data::resolve_data_dir("");
  std::error_code ec;
  return dir.ok() && fs::exists(*dir / file, ec);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("starling_sim_test_" + name);
  fs::remove_all(d);
  return d;
}

// 40 MNIST clients, 5 a round, a small 2NN, int8 with error feedback.
v1::FederationConfig tiny_mnist() {
  v1::FederationConfig c;
  const Status st = config::parse_toml(R"(
[simulate]
mode = "IN_PROCESS"
workers = 2
progress = false
[data]
num_clients = 40
partition = "DIRICHLET"
alpha = 0.5
[model]
hidden = 16
[rounds]
num_rounds = 4
clients_per_round = 5
fraction = 0.0
[local]
local_steps = 40
batch_size = 20
learning_rate = 0.05
codec = "int8:block=128,ef=1"
[eval]
max_examples = 1000
)",
                                       "tiny_mnist", &c);
  REQUIRE(st.ok());
  return c;
}

RunOptions quiet(const fs::path& dir) {
  RunOptions o;
  o.out_dir = dir.string();
  o.progress = false;
  return o;
}

TEST_CASE("two runs with the same seed write identical metrics files", "[sim][net]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  const fs::path a = fresh_dir("same_a"), b = fresh_dir("same_b"), c = fresh_dir("same_c");
  auto cfg = tiny_mnist();
  auto sa = run_simulation(cfg, "a", quiet(a));
  INFO(sa.status().to_string());
  REQUIRE(sa.ok());
  // One worker instead of two, and every residual spilled to disk: the same numbers.
  auto other = cfg;
  other.mutable_simulate()->set_workers(1);
  other.mutable_simulate()->set_residual_memory_mb(0);
  auto sb = run_simulation(other, "b", quiet(b));
  REQUIRE(sb.ok());
  CHECK(sb->residuals.peak_disk_bytes > 0);
  CHECK(sb->residuals.peak_memory_bytes == 0);
  const std::string ma = slurp(a / "metrics.jsonl");
  CHECK(std::count(ma.begin(), ma.end(), '\n') == 4);
  CHECK(ma == slurp(b / "metrics.jsonl"));
  CHECK(slurp(a / "model.safetensors") == slurp(b / "model.safetensors"));
  // Another seed, other numbers.
  cfg.mutable_rounds()->set_seed(2);
  REQUIRE(run_simulation(cfg, "c", quiet(c)).ok());
  CHECK(ma != slurp(c / "metrics.jsonl"));
  for (const auto& d : {a, b, c}) fs::remove_all(d);
}

TEST_CASE("the report shows the expected series", "[sim][net]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  const fs::path dir = fresh_dir("report");
  auto s = run_simulation(tiny_mnist(), "tiny", quiet(dir));
  REQUIRE(s.ok());
  CHECK(s->rounds == 4);
  CHECK(s->final_accuracy > 0.3);
  for (const char* f : {"config.toml", "metrics.jsonl", "timing.jsonl", "model.safetensors",
                        "summary.json", "report.html"}) {
    INFO(f);
    CHECK(fs::file_size(dir / f) > 0);
  }
  const std::string html = slurp(dir / "report.html");
  CHECK_THAT(html, Contains("<!DOCTYPE html>") && Contains("</html>"));
  // Each chart with its series, each series with as many points as its rounds.
  const std::regex poly(
      R"re(data-chart="([a-z_]+)"[^]*?<polyline data-series="([a-z_]+)"[^>]*points="([^"]*)")re");
  int charts = 0;
  for (const char* chart :
       {"accuracy_vs_round", "loss_vs_round", "accuracy_vs_time", "accuracy_vs_bytes",
        "loss_vs_time", "loss_vs_bytes", "participation"}) {
    INFO(chart);
    const auto at = html.find(std::string("data-chart=\"") + chart + "\"");
    REQUIRE(at != std::string::npos);
    const auto end = html.find("</svg>", at);
    const std::string svg = html.substr(at, end - at);
    const auto p = svg.find("<polyline data-series=\"");
    REQUIRE(p != std::string::npos);
    const auto pts_at = svg.find("points=\"", p) + 8;
    const std::string pts = svg.substr(pts_at, svg.find('"', pts_at) - pts_at);
    const auto n = std::count(pts.begin(), pts.end(), ',');
    if (std::string(chart) == "participation") {
      CHECK(n == 40);  // one bar per client
    } else {
      CHECK(n == 4);  // one point per evaluated round
    }
    ++charts;
  }
  CHECK(charts == 7);
  CHECK_THAT(html, Contains("data-series=\"test_accuracy\"") &&
                       Contains("data-series=\"train_loss,test_loss\"") &&
                       Contains("data-series=\"participation\""));
  // The model reloads with the 2NN's tensors.
  auto model = io::load_safetensors(dir / "model.safetensors");
  REQUIRE(model.ok());
  CHECK(model->tensors.size() == 6);
  fs::remove_all(dir);
}

TEST_CASE("emulated dropouts, stragglers and late joiners show in the records", "[sim][net]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  const fs::path dir = fresh_dir("emulation");
  auto cfg = tiny_mnist();
  cfg.mutable_rounds()->set_num_rounds(3);
  cfg.mutable_rounds()->set_over_selection(1.0f);  // 10 selected for 5 updates
  cfg.mutable_simulate()->set_dropout(0.3f);
  cfg.mutable_simulate()->set_late_join_fraction(0.5f);
  cfg.mutable_simulate()->set_late_join_rounds(2);
  cfg.mutable_eval()->set_every_rounds(3);
  REQUIRE(run_simulation(cfg, "emu", quiet(dir)).ok());
  std::ifstream f(dir / "metrics.jsonl");
  std::string line;
  int rounds = 0, dropped = 0, stragglers = 0, available_first = 0, available_last = 0;
  double sim_prev = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    ++rounds;
    CHECK(j["selected"] == 10);
    CHECK(j["updates"].get<int>() <= 5);
    CHECK(j["sim_seconds"].get<double>() > sim_prev);
    sim_prev = j["sim_seconds"].get<double>();
    dropped += j["dropped"].get<int>();
    stragglers += j["stragglers"].get<int>();
    if (rounds == 1) available_first = j["available"];
    available_last = j["available"];
  }
  CHECK(rounds == 3);
  CHECK(dropped > 0);
  CHECK(stragglers > 0);                    // over-selected clients that came after the quorum
  CHECK(available_first < available_last);  // the late joiners arrived
  CHECK(available_last == 40);
  fs::remove_all(dir);
}

TEST_CASE("a loopback simulation runs the real aggregator over mutual TLS", "[sim][net]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  const fs::path dir = fresh_dir("loopback");
  v1::FederationConfig cfg;
  REQUIRE(config::parse_toml(default_config_toml(), "default", &cfg).ok());
  REQUIRE(
      apply_overrides({"simulate.mode=LOOPBACK", "simulate.num_clients=4", "rounds.num_rounds=2",
                       "rounds.clients_per_round=3", "model.n_layer=1", "model.n_embd=16",
                       "model.block_size=16", "local.local_steps=2", "local.batch_size=4",
                       "eval.max_examples=16", "eval.every_rounds=1", "simulate.progress=false"},
                      &cfg)
          .ok());
  auto s = run_simulation(cfg, "loopback", quiet(dir));
  REQUIRE(s.ok());
  CHECK(s->mode == "loopback");
  CHECK(s->rounds == 2);
  CHECK(s->clients == 4);
  CHECK(s->bytes_total > 0);
  CHECK(s->final_loss > 0);
  const std::string metrics = slurp(dir / "metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 2);
  CHECK(fs::exists(dir / "state" / "global_model.safetensors"));
  // The model is a GPT checkpoint `starling sample` can read.
  auto gpt = models::load_gpt_checkpoint(dir / "model.safetensors");
  REQUIRE(gpt.ok());
  CHECK(gpt->model->config().n_embd == 16);
  // Its val loss (what `starling sample` logs) is the held-out loss of the final model.
  CHECK(gpt->info.val_loss > 0);
  CHECK(gpt->info.val_loss == Approx(s->final_loss).epsilon(1e-5));  // stored as text
  CHECK(gpt->info.iter == 2);
  // The default compares with the same model trained centrally on as many samples: 2 rounds
  // x 3 updates x 2 steps x batch 4.
  CHECK(s->has_central);
  CHECK(s->central_samples == 48);
  CHECK(s->central_loss > 0);
  CHECK(s->central_loss < 5);
  CHECK_THAT(slurp(dir / "summary.json"), Contains("\"central_baseline\""));
  fs::remove_all(dir);
}

TEST_CASE("a sweep runs each value and compares them", "[sim][net]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  const fs::path dir = fresh_dir("sweep");
  auto cfg = tiny_mnist();
  cfg.mutable_rounds()->set_num_rounds(2);
  cfg.mutable_sweep()->set_key("local.codec");
  cfg.mutable_sweep()->add_values("identity");
  cfg.mutable_sweep()->add_values("topk:ratio=0.05,ef=1");
  auto runs = expand_sweep(cfg, "sweep.toml");
  REQUIRE(runs.ok());
  REQUIRE(runs->size() == 2);
  CHECK((*runs)[1].first == "local.codec=topk:ratio=0.05,ef=1");
  CHECK((*runs)[1].second.local().codec() == "topk:ratio=0.05,ef=1");
  CHECK_FALSE((*runs)[1].second.has_sweep());
  auto all = run_sweep(*runs, dir, quiet(dir));
  REQUIRE(all.ok());
  REQUIRE(all->size() == 2);
  auto uploaded = [&](const std::string& run) {
    std::ifstream f(dir / run / "metrics.jsonl");
    uint64_t up = 0;
    for (std::string line; std::getline(f, line);) {
      up += nlohmann::json::parse(line)["bytes_up"].get<uint64_t>();
    }
    return up;
  };
  const uint64_t dense = uploaded("local.codec=identity");
  const uint64_t sparse = uploaded("local.codec=topk_ratio=0.05_ef=1");
  CHECK(dense > 0);
  CHECK(sparse * 5 < dense);  // top-k 5% (value and index) sends far less
  CHECK((*all)[1].bytes_total < (*all)[0].bytes_total);
  const std::string table = slurp(dir / "comparison.txt");
  CHECK_THAT(table,
             Contains("local.codec=identity") && Contains("local.codec=topk_ratio=0.05_ef=1"));
  CHECK_THAT(slurp(dir / "sweep.html"), Contains("data-chart=\"sweep_accuracy_vs_round\""));
  // Bad sweeps name the key.
  auto bad = cfg;
  bad.mutable_sweep()->set_key("local.nope");
  CHECK_THAT(expand_sweep(bad, "s.toml").status().message(), Contains("local.nope"));
  bad.mutable_sweep()->set_key("local.codec");
  bad.mutable_sweep()->add_values("identity");
  CHECK_THAT(expand_sweep(bad, "s.toml").status().message(), Contains("repeats"));
  fs::remove_all(dir);
}

TEST_CASE("every sim config loads and the embedded default is configs/sim_default.toml", "[sim]") {
  int found = 0;
  for (const auto& e : fs::directory_iterator(fs::path(STARLING_SOURCE_DIR) / "configs")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("sim_", 0) != 0 || e.path().extension() != ".toml") continue;
    INFO(name);
    ++found;
    auto c = aggregator::load_federation_config(e.path());
    REQUIRE(c.ok());
    CHECK(expand_sweep(*c, name).ok());
  }
  CHECK(found >= 3);
  CHECK(slurp(fs::path(STARLING_SOURCE_DIR) / "configs/sim_default.toml") ==
        std::string(default_config_toml()));
  v1::FederationConfig c;
  REQUIRE(config::parse_toml(default_config_toml(), "default", &c).ok());
  CHECK(c.simulate().mode() == v1::FedSimulateConfig::IN_PROCESS);
  CHECK(c.simulate().central_baseline());
  CHECK(c.data().partition() == v1::FedDataConfig::ROLES);
  CHECK(c.model().arch() == v1::FedModelConfig::GPT);
  CHECK(c.local().codec().rfind("int8", 0) == 0);
  // Bad simulation input is an error naming the key.
  v1::FederationConfig bad = c;
  bad.mutable_data()->set_dataset("mnist");
  CHECK_THAT(aggregator::validate_federation_config(bad, "b.toml").message(),
             Contains("data.partition") && Contains("model.arch"));
}

TEST_CASE("a fleet larger than the partition is an error", "[sim]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  auto cfg = tiny_mnist();
  cfg.mutable_simulate()->set_num_clients(41);
  auto r = run_simulation(cfg, "big.toml", quiet(fresh_dir("big")));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("simulate.num_clients") && Contains("big.toml"));
  fs::remove_all(fresh_dir("big"));
}

}  // namespace
}  // namespace starling::sim

namespace starling::sim {
namespace {

TEST_CASE("a gossip config runs gossip's simulation into a run folder and report", "[sim]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "starling_sim_test_gossip";
  std::filesystem::remove_all(dir);
  v1::GossipConfig cfg;
  REQUIRE(
      config::load_toml(
          std::filesystem::path(STARLING_SOURCE_DIR) / "configs/gossip_consensus_ring16.toml", &cfg)
          .ok());
  cfg.mutable_rounds()->set_num_rounds(4);
  RunOptions o;
  o.out_dir = dir.string();
  o.progress = false;
  auto s = run_gossip_simulation(cfg, "ring16", o);
  REQUIRE(s.ok());
  CHECK(s->rounds == 4);
  CHECK(s->clients == 16);
  CHECK(s->bytes_total > 0);
  std::ifstream f(dir / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(f, line);) ++lines;
  CHECK(lines == 4);
  std::ifstream r(dir / "report.html");
  std::stringstream html;
  html << r.rdbuf();
  CHECK_THAT(html.str(), Catch::Contains("data-chart=\"loss_vs_round\"") &&
                             Catch::Contains("gossip (in-process)"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace starling::sim

namespace starling::sim {
namespace {

TEST_CASE("a federated GPT on GPT-2's BPE tokens: trains, checkpoints, validated", "[sim]") {
  if (!have_data("gpt2/encoder.json") || !have_data("tinyshakespeare/input.txt")) return;
  const fs::path dir = fresh_dir("bpe");
  v1::FederationConfig cfg;
  REQUIRE(config::parse_toml(default_config_toml(), "default", &cfg).ok());
  REQUIRE(apply_overrides({"data.tokenizer=GPT2", "rounds.num_rounds=2", "model.n_layer=1",
                           "model.n_embd=16", "model.block_size=16", "local.local_steps=2",
                           "local.batch_size=4", "eval.max_examples=8", "eval.every_rounds=1",
                           "simulate.progress=false", "simulate.central_baseline=false"},
                          &cfg)
              .ok());
  auto s = run_simulation(cfg, "bpe", quiet(dir));
  REQUIRE(s.ok());
  CHECK(s->rounds == 2);
  CHECK_THAT(s->task, Contains("gpt2-bpe GPT"));
  CHECK(s->final_loss > 0);
  CHECK(s->final_loss < 12);  // ln(50257) = 10.8 at uniform
  auto gpt = models::load_gpt_checkpoint(dir / "model.safetensors");
  REQUIRE(gpt.ok());
  CHECK(gpt->tokenizer->name() == "gpt2-bpe");
  CHECK(gpt->tokenizer->vocab_size() == 50257);
  CHECK(gpt->model->config().vocab_size == 50257);
  // BPE is for the GPT only.
  v1::FederationConfig mdlm = cfg;
  mdlm.mutable_model()->set_arch(v1::FedModelConfig::MDLM);
  CHECK_THAT(aggregator::validate_federation_config(mdlm, "m.toml").message(),
             Contains("data.tokenizer"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::sim

namespace starling::sim {
namespace {

// Federated LoRA on a pretrained base: the tiny GPT-2 that `transformers` wrote
// (tests/fixtures/hf_gpt2_tiny), its own 320-token BPE, rank-4 adapters on every projection.
v1::FederationConfig lora_config() {
  v1::FederationConfig cfg;
  REQUIRE(config::parse_toml(default_config_toml(), "default", &cfg).ok());
  const std::string base =
      "hf:" + (fs::path(STARLING_SOURCE_DIR) / "tests" / "fixtures" / "hf_gpt2_tiny").string();
  REQUIRE(apply_overrides(
              {"model.init_from=\"" + base + "\"", "lora.rank=4", "lora.alpha=8",
               "rounds.num_rounds=3", "rounds.clients_per_round=4",
               "model.local_optimizer=\"ADAMW\"", "local.codec=\"identity\"", "local.local_steps=4",
               "local.batch_size=4", "local.learning_rate=0.01", "eval.max_examples=16",
               "eval.every_rounds=1", "simulate.progress=false", "simulate.central_baseline=false"},
              &cfg)
              .ok());
  cfg.mutable_model()->clear_n_layer();
  cfg.mutable_model()->clear_n_head();
  cfg.mutable_model()->clear_n_embd();
  return cfg;
}

TEST_CASE("federated LoRA moves only the adapters and lowers the pretrained model's loss",
          "[sim][lora]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  v1::FederationConfig cfg = lora_config();
  auto task = SimTask::create(cfg, "lora.toml");
  REQUIRE(task.ok());
  // The federation's vector is the adapters: 2 blocks x (4 (32 + 96) + 4 (32 + 32) +
  // 4 (32 + 128) + 4 (128 + 32)) = 4,096 beside the base's 36,736.
  const auto& layout = (*task)->layout();
  REQUIRE(layout.size() == 16);
  for (const auto& e : layout) REQUIRE_THAT(e.name, Contains(".lora_"));
  const auto initial = (*task)->initial_model();
  REQUIRE(initial.size() == 4096);
  CHECK_THAT((*task)->describe(), Contains("LoRA rank 4") && Contains("4096 trained and moved"));
  // Round 0's model is the base: its loss is the pretrained model's.
  const double base_loss = (*task)->evaluate(initial).loss;

  const fs::path dir = fresh_dir("lora");
  auto s = run_simulation(cfg, "lora.toml", quiet(dir));
  REQUIRE(s.ok());
  CHECK(s->rounds == 3);
  CHECK(s->final_loss < base_loss);
  // 4 clients x 3 rounds of 4,096 f32 adapters, plus framing: far below 36,736-float models.
  CHECK(s->bytes_total < 12 * 36736 * 4);
  // The saved model is a plain GPT-2-shaped checkpoint with the adapters merged in.
  auto gpt = models::load_gpt_checkpoint(dir / "model.safetensors");
  REQUIRE(gpt.ok());
  CHECK(gpt->tokenizer->vocab_size() == 320);
  CHECK(gpt->model->config().bias);
  CHECK(gpt->model->config().gelu_tanh);
  CHECK(gpt->model->num_parameters() == 36736);
  fs::remove_all(dir);
}

TEST_CASE("WikiText-2 by article: one client per article, federated LoRA lowers the loss",
          "[sim][lora]") {
  if (!have_data("wikitext-2/wiki.test.tokens")) return;
  v1::FederationConfig cfg = lora_config();
  REQUIRE(apply_overrides({"data.dataset=\"wikitext-2-test\"", "data.partition=\"ARTICLES\""}, &cfg)
              .ok());
  REQUIRE(aggregator::validate_federation_config(cfg, "wiki.toml").ok());
  auto task = SimTask::create(cfg, "wiki.toml");
  REQUIRE(task.ok());
  // The fixture holds WikiText-2 test's first 8 articles, the whole split 61 of 1000 bytes.
  CHECK(((*task)->num_clients() == 8 || (*task)->num_clients() == 61));
  CHECK_THAT((*task)->describe(), Contains("wikitext-2-test by Wikipedia article"));
  const double base_loss = (*task)->evaluate((*task)->initial_model()).loss;
  const fs::path dir = fresh_dir("lora_wiki");
  auto s = run_simulation(cfg, "wiki.toml", quiet(dir));
  REQUIRE(s.ok());
  CHECK(s->final_loss < base_loss);
  fs::remove_all(dir);

  // ARTICLES splits WikiText only, and WikiText is split by article only.
  v1::FederationConfig bad = cfg;
  bad.mutable_data()->set_partition(v1::FedDataConfig::ROLES);
  CHECK_THAT(aggregator::validate_federation_config(bad, "wiki.toml").message(),
             Contains("must be ARTICLES exactly when data.dataset is wikitext-2-test"));
  bad = cfg;
  bad.mutable_data()->set_dataset("shakespeare");
  CHECK_THAT(aggregator::validate_federation_config(bad, "wiki.toml").message(),
             Contains("must be ROLES exactly when data.dataset is shakespeare"));
}

TEST_CASE("a shape key that disagrees with init_from, or [lora] on another arch, is an error",
          "[sim][lora]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  v1::FederationConfig cfg = lora_config();
  cfg.mutable_model()->set_n_embd(64);
  auto t = SimTask::create(cfg, "lora.toml");
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(),
             Contains("lora.toml: key 'model.n_embd' = 64") && Contains("has 32"));
  cfg = lora_config();
  cfg.mutable_model()->set_block_size(64);
  t = SimTask::create(cfg, "lora.toml");
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Contains("model.block_size") && Contains("32 positions"));
  cfg = lora_config();
  cfg.mutable_model()->set_init_from("hf:/nonexistent/dir");
  t = SimTask::create(cfg, "lora.toml");
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Contains("model.init_from") && Contains("/nonexistent/dir"));
  cfg = lora_config();
  cfg.mutable_lora()->add_targets("attn.q");
  t = SimTask::create(cfg, "lora.toml");
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Contains("lora.targets"));
}

}  // namespace
}  // namespace starling::sim
