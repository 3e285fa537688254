// The model-kind seam (sim/model_kind.h): every [model] arch has exactly one registered kind; a
// client's trainer, which loads only its own partition, trains bit for bit as the simulation's
// trainer of that client; the aggregator's view of an image kind loads no training data and
// gives the same model, layout and evaluation as the simulation's.
#include "sim/model_kind.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/config/toml_config.h"
#include "core/data/data_dir.h"

namespace starling::sim {
namespace {

using Catch::Contains;

v1::FederationConfig parse(const char* toml) {
  v1::FederationConfig c;
  const Status st = config::parse_toml(toml, "kind.toml", &c);
  INFO(st.to_string());
  REQUIRE(st.ok());
  return c;
}

constexpr const char* kMnist = R"(
[data]
num_clients = 6
partition = "DIRICHLET"
alpha = 0.5
[model]
hidden = 8
[rounds]
num_rounds = 1
[local]
batch_size = 10
learning_rate = 0.05
[eval]
max_examples = 200
)";

constexpr const char* kGpt = R"(
[data]
dataset = "shakespeare"
partition = "ROLES"
num_clients = 3
min_role_chars = 20000
[model]
arch = "GPT"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
[rounds]
num_rounds = 1
[local]
batch_size = 4
learning_rate = 0.05
[eval]
max_examples = 8
)";

v1::RoundPlan plan_of(uint64_t seed) {
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_local_steps(3);
  plan.set_batch_size(4);
  plan.set_learning_rate(0.05f);
  plan.set_seed(seed);
  return plan;
}

// Client `k`'s own trainer (make_client_trainer) against the simulation's trainer of client k:
// the same update, bit for bit.
void check_client_matches_simulation(const v1::FederationConfig& c, int k) {
  auto kind = model_kind(c, "kind.toml");
  REQUIRE(kind.ok());
  auto task = SimTask::create(c, "kind.toml");
  INFO(task.status().to_string());
  REQUIRE(task.ok());
  std::string what;
  auto own = (*kind)->make_client_trainer(c, "kind.toml", static_cast<uint32_t>(k), &what);
  INFO(own.status().to_string());
  REQUIRE(own.ok());
  CHECK_FALSE(what.empty());
  auto shared = (*task)->make_trainer(k);
  REQUIRE((*own)->layout().size() == shared->layout().size());
  const auto global = (*task)->initial_model();
  std::vector<float> a(global.size()), b(global.size());
  const auto plan = plan_of(100 + static_cast<uint64_t>(k));
  auto ra = (*own)->train(global, plan, a);
  auto rb = shared->train(global, plan, b);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(ra->num_samples == rb->num_samples);
  CHECK(ra->loss == rb->loss);
  CHECK(a == b);
  CHECK(std::any_of(a.begin(), a.end(), [](float x) { return x != 0.0f; }));
}

}  // namespace

TEST_CASE("model kinds: every [model] arch has exactly one registered kind", "[sim]") {
  const auto* arch = v1::FedModelConfig::Arch_descriptor();
  std::set<int> seen;
  for (const ModelKind& k : model_kinds()) {
    CHECK(seen.insert(static_cast<int>(k.arch)).second);  // no arch twice
    REQUIRE(arch->FindValueByNumber(k.arch) != nullptr);
    std::string lower = arch->FindValueByNumber(k.arch)->name();
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    CHECK(k.name == lower);
    CHECK(k.make_task != nullptr);
    CHECK(k.make_client_trainer != nullptr);
  }
  for (int i = 0; i < arch->value_count(); ++i) {
    INFO("arch " << arch->value(i)->name());
    CHECK(seen.count(arch->value(i)->number()) == 1);
  }
}

TEST_CASE(
    "model kinds: an image client's trainer loads its partition only and trains as the "
    "simulation's",
    "[sim]") {
  auto c = parse(kMnist);
  for (int k : {0, 4}) check_client_matches_simulation(c, k);
  auto kind = model_kind(c, "kind.toml");
  REQUIRE(kind.ok());
  std::string what;
  auto outside = (*kind)->make_client_trainer(c, "kind.toml", 6, &what);
  REQUIRE_FALSE(outside.ok());
  CHECK_THAT(outside.status().message(), Contains("kind.toml") && Contains("partition 6"));
  c.mutable_model()->set_arch(v1::FedModelConfig::CNN);
  c.mutable_model()->set_cnn_channels1(2);
  c.mutable_model()->set_cnn_channels2(2);
  c.mutable_model()->set_cnn_fc(8);
  check_client_matches_simulation(c, 1);
}

TEST_CASE("model kinds: a GPT client's trainer trains as the simulation's", "[sim]") {
  auto dir = data::resolve_data_dir("");
  if (!dir.ok()) return;
  check_client_matches_simulation(parse(kGpt), 2);
}

TEST_CASE("model kinds: a GPT client on several GPUs needs a batch that splits over them",
          "[sim]") {
  auto dir = data::resolve_data_dir("");
  if (!dir.ok()) return;
  auto c = parse(kGpt);
  c.mutable_model()->set_local_optimizer(v1::FedModelConfig::ADAMW);
  c.mutable_client()->set_device("cuda");
  for (uint32_t g : {0u, 1u, 2u}) c.mutable_client()->add_gpus(g);
  auto kind = model_kind(c, "kind.toml");
  REQUIRE(kind.ok());
  std::string what;
  // 4 rows over 3 GPUs: refused before any GPU is looked for.
  auto t = (*kind)->make_client_trainer(c, "kind.toml", 0, &what);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(),
             Contains("kind.toml") && Contains("local.batch_size") && Contains("client.gpus"));
  // 6 rows split: then the GPUs are looked for (none on the machines the suite runs on, or a
  // build without CUDA), an error naming the key, never a silent CPU run.
  c.mutable_local()->set_batch_size(6);
  t = (*kind)->make_client_trainer(c, "kind.toml", 0, &what);
  if (!t.ok()) CHECK_THAT(t.status().message(), Contains("client.device"));
}

TEST_CASE("model kinds: the MDLM, the DDPM and the CNN train on a GPU when asked, or refuse by key",
          "[sim]") {
  auto dir = data::resolve_data_dir("");
  if (!dir.ok()) return;
  auto c = parse(kGpt);
  c.mutable_model()->set_arch(v1::FedModelConfig::MDLM);
  c.mutable_model()->set_local_optimizer(v1::FedModelConfig::ADAMW);
  c.mutable_client()->set_device("cuda");
  // The aggregator trains nothing and checks no GPU; a simulation and a client check theirs
  // (none on the machines the suite runs on, or a build without CUDA).
  auto server = SimTask::create(c, "kind.toml", TaskUse::kServer);
  INFO(server.status().to_string());
  REQUIRE(server.ok());
  CHECK_THAT((*server)->describe(), Contains("MDLM") && Contains("cuda:0 (fused engine)"));
  auto simulation = SimTask::create(c, "kind.toml", TaskUse::kSimulation);
  if (!simulation.ok()) {
    CHECK_THAT(simulation.status().message(), Contains("kind.toml") && Contains("client.device"));
  }
  auto kind = model_kind(c, "kind.toml");
  REQUIRE(kind.ok());
  std::string what;
  auto t = (*kind)->make_client_trainer(c, "kind.toml", 0, &what);
  if (!t.ok()) CHECK_THAT(t.status().message(), Contains("client.device"));
  // The DDPM: its U-Net on the GPU through the ops' CUDA forms (no GPU here: the simulation
  // and the client refuse by key, never train on the CPU instead).
  auto m = parse(kMnist);
  m.mutable_model()->set_arch(v1::FedModelConfig::DDPM);
  m.mutable_model()->mutable_ddpm()->set_base_channels(4);
  m.mutable_model()->mutable_ddpm()->add_channel_mult(1);
  m.mutable_model()->mutable_ddpm()->add_channel_mult(2);
  m.mutable_model()->mutable_ddpm()->set_groups(2);
  m.mutable_client()->set_device("cuda");
  auto ddpm = SimTask::create(m, "kind.toml", TaskUse::kServer);
  INFO(ddpm.status().to_string());
  REQUIRE(ddpm.ok());
  CHECK_THAT((*ddpm)->describe(), Contains("DDPM") && Contains("cuda:0"));
  auto ddpm_sim = SimTask::create(m, "kind.toml", TaskUse::kSimulation);
  if (!ddpm_sim.ok()) {
    CHECK_THAT(ddpm_sim.status().message(), Contains("kind.toml") && Contains("client.device"));
  }
  auto ddpm_kind = model_kind(m, "kind.toml");
  REQUIRE(ddpm_kind.ok());
  auto dt = (*ddpm_kind)->make_client_trainer(m, "kind.toml", 0, &what);
  if (!dt.ok()) CHECK_THAT(dt.status().message(), Contains("client.device"));
  m.mutable_client()->add_gpus(0);
  m.mutable_client()->add_gpus(1);
  auto two = (*ddpm_kind)->make_client_trainer(m, "kind.toml", 0, &what);
  REQUIRE_FALSE(two.ok());
  CHECK_THAT(two.status().message(), Contains("client.gpus") && Contains("one GPU"));
  // The CNN likewise (and one GPU per edge client).
  m.clear_client();
  m.mutable_client()->set_device("cuda");
  m.mutable_model()->set_arch(v1::FedModelConfig::CNN);
  m.mutable_model()->clear_ddpm();
  auto cnn = SimTask::create(m, "kind.toml", TaskUse::kServer);
  INFO(cnn.status().to_string());
  REQUIRE(cnn.ok());
  CHECK_THAT((*cnn)->describe(), Contains("CNN") && Contains("cuda:0"));
  auto cnn_sim = SimTask::create(m, "kind.toml", TaskUse::kSimulation);
  if (!cnn_sim.ok()) {
    CHECK_THAT(cnn_sim.status().message(), Contains("kind.toml") && Contains("client.device"));
  }
}

TEST_CASE(
    "model kinds: the aggregator's view of an image task loads no training data and "
    "agrees with the simulation's",
    "[sim]") {
  const auto c = parse(kMnist);
  auto server = SimTask::create(c, "kind.toml", TaskUse::kServer);
  auto simulation = SimTask::create(c, "kind.toml", TaskUse::kSimulation);
  REQUIRE(server.ok());
  REQUIRE(simulation.ok());
  CHECK_THAT((*server)->describe(), Contains("training data on the clients"));
  CHECK((*server)->num_clients() == 6);
  REQUIRE((*server)->layout().size() == (*simulation)->layout().size());
  for (size_t i = 0; i < (*server)->layout().size(); ++i) {
    CHECK((*server)->layout()[i].name == (*simulation)->layout()[i].name);
    CHECK((*server)->layout()[i].shape == (*simulation)->layout()[i].shape);
  }
  const auto global = (*server)->initial_model();
  CHECK(global == (*simulation)->initial_model());
  const TaskEval a = (*server)->evaluate(global);
  const TaskEval b = (*simulation)->evaluate(global);
  CHECK(a.loss == b.loss);
  CHECK(a.accuracy == b.accuracy);
  CHECK(a.loss > 0.0);
}

TEST_CASE("model kinds: an EXTERNAL model's client must run the exec trainer", "[sim]") {
  auto c = parse(kMnist);
  c.mutable_model()->set_arch(v1::FedModelConfig::EXTERNAL);
  auto kind = model_kind(c, "own.toml");
  REQUIRE(kind.ok());
  std::string what;
  auto t = (*kind)->make_client_trainer(c, "own.toml", 0, &what);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Contains("own.toml") && Contains("client.trainer"));
}

}  // namespace starling::sim
