// Federations of the diffusion models (model.arch MDLM and DDPM): one in-process round equals the
// weighted average of the clients' updates, the model saved is a checkpoint `starling sample`
// reads, config errors name the key, and the configs/fed_{mdlm,ddpm}_*.toml files load.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include "aggregator/fed_task.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "models/ddpm/checkpoint.h"
#include "models/gpt/checkpoint.h"
#include "models/mdlm/checkpoint.h"
#include "sim/diffusion_task.h"
#include "sim/engine.h"
#include "sim/task.h"

namespace starling::sim {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

bool have_data(const char* file) {
  auto dir = data::resolve_data_dir("");
  std::error_code ec;
  return dir.ok() && fs::exists(*dir / file, ec);
}

// Every update a client trained, by client.
struct Recorded {
  std::mutex mu;
  std::map<int, std::pair<uint64_t, std::vector<float>>> updates;
};

class RecordingTrainer final : public edge_client::LocalTrainer {
 public:
  RecordingTrainer(std::unique_ptr<edge_client::LocalTrainer> inner, int client, Recorded* out)
      : inner_(std::move(inner)), client_(client), out_(out) {}
  const compress::Layout& layout() const override { return inner_->layout(); }
  Result<edge_client::TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                                         std::span<float> delta) override {
    auto r = inner_->train(global, plan, delta);
    if (r.ok()) {
      std::lock_guard lock(out_->mu);
      out_->updates[client_] = {r->num_samples, std::vector<float>(delta.begin(), delta.end())};
    }
    return r;
  }

 private:
  std::unique_ptr<edge_client::LocalTrainer> inner_;
  int client_;
  Recorded* out_;
};

// The real task, with each trainer's update recorded.
class RecordingTask final : public SimTask {
 public:
  RecordingTask(std::unique_ptr<SimTask> inner, Recorded* out)
      : inner_(std::move(inner)), out_(out) {}
  int num_clients() const override { return inner_->num_clients(); }
  const compress::Layout& layout() const override { return inner_->layout(); }
  std::vector<float> initial_model() const override { return inner_->initial_model(); }
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    return std::make_unique<RecordingTrainer>(inner_->make_trainer(client), client, out_);
  }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    return inner_->local_steps(client, plan);
  }
  TaskEval evaluate(std::span<const float> global) override { return inner_->evaluate(global); }
  Status save_model(const fs::path& path, std::span<const float> global,
                    uint64_t round) const override {
    return inner_->save_model(path, global, round);
  }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<SimTask> inner_;
  Recorded* out_;
};

v1::FederationConfig parse(const char* toml) {
  v1::FederationConfig c;
  const Status st = config::parse_toml(toml, "test.toml", &c);
  INFO(st.to_string());
  REQUIRE(st.ok());
  return c;
}

// One round over every client with the identity codec and FedAvg at server_lr 1: the new global
// model is the initial one plus the num_samples-weighted mean of the recorded deltas.
void check_one_round_is_weighted_average(const v1::FederationConfig& cfg, const char* name) {
  auto task = SimTask::create(cfg, name);
  INFO(task.status().to_string());
  REQUIRE(task.ok());
  const auto initial = (*task)->initial_model();
  Recorded rec;
  RecordingTask recording(std::move(*task), &rec);
  const fs::path dir = fs::temp_directory_path() / (std::string("starling_diffusion_") + name);
  fs::remove_all(dir);
  auto res = run_in_process(cfg, recording, dir, nullptr);
  INFO(res.status().to_string());
  REQUIRE(res.ok());
  REQUIRE(res->rounds.size() == 1);
  const int clients = res->num_clients;
  CHECK(clients == 3);
  CHECK(res->rounds[0].updates == clients);
  REQUIRE(static_cast<int>(rec.updates.size()) == clients);
  std::vector<double> sum(initial.size(), 0.0);
  double weight = 0;
  for (const auto& [k, u] : rec.updates) {
    CHECK(res->participation[static_cast<size_t>(k)] == 1);
    weight += static_cast<double>(u.first);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<double>(u.first) * u.second[i];
  }
  REQUIRE(res->global.size() == initial.size());
  double max_err = 0, moved = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double want = static_cast<double>(initial[i]) + sum[i] / weight;
    max_err = std::max(max_err, std::fabs(want - static_cast<double>(res->global[i])));
    moved = std::max(moved, std::fabs(static_cast<double>(res->global[i] - initial[i])));
  }
  CHECK(moved > 1e-4);    // the round changed the model
  CHECK(max_err < 1e-6);  // float rounding of the sum, nothing more
  // The final model saves as a checkpoint of the architecture.
  fs::create_directories(dir);
  const Status saved = recording.save_model(dir / "model.safetensors", res->global, 1);
  INFO(saved.to_string());
  REQUIRE(saved.ok());
  CHECK(fs::file_size(dir / "model.safetensors") > 0);
  fs::remove_all(dir);
}

constexpr const char* kMdlm = R"(
[simulate]
mode = "IN_PROCESS"
workers = 1
progress = false
num_clients = 3
[data]
dataset = "shakespeare"
partition = "ROLES"
num_clients = 3
min_role_chars = 20000
[model]
arch = "MDLM"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
local_optimizer = "ADAMW"
[model.diffusion]
noise = "absorbing"
[rounds]
num_rounds = 1
clients_per_round = 3
fraction = 0.0
min_updates = 3
[local]
local_steps = 2
batch_size = 4
learning_rate = 0.003
codec = "identity"
[eval]
every_rounds = 1
max_examples = 8
)";

constexpr const char* kDdpm = R"(
[simulate]
mode = "IN_PROCESS"
workers = 1
progress = false
[data]
dataset = "mnist"
partition = "DIRICHLET"
alpha = 0.5
num_clients = 3
[model]
arch = "DDPM"
[model.ddpm]
base_channels = 4
channel_mult = [1, 2]
groups = 2
attention = false
timesteps = 20
sampling_steps = 5
[rounds]
num_rounds = 1
clients_per_round = 3
fraction = 0.0
min_updates = 3
[local]
local_steps = 1
batch_size = 2
learning_rate = 0.05
codec = "identity"
[eval]
every_rounds = 1
max_examples = 4
)";

// The task's initial model saved as a checkpoint at `round`, then read back by `load`
// (a path -> Result<T> function); the file is removed either way.
template <typename Load>
auto saved_and_loaded(SimTask& task, const std::string& name, uint64_t round, Load load) {
  const fs::path file = fs::temp_directory_path() / ("starling_diffusion_" + name + ".safetensors");
  REQUIRE(task.save_model(file, task.initial_model(), round).ok());
  auto loaded = load(file);
  fs::remove(file);
  INFO(loaded.status().to_string());
  REQUIRE(loaded.ok());
  return std::move(*loaded);
}

const auto load_mdlm = [](const fs::path& f) { return models::load_mdlm_checkpoint(f); };
const auto load_gpt = [](const fs::path& f) { return models::load_gpt_checkpoint(f); };
const auto load_ddpm = [](const fs::path& f) { return models::load_ddpm_checkpoint(f); };

TEST_CASE("a federated MDLM round is the weighted average of its clients' updates", "[sim]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  auto cfg = parse(kMdlm);
  check_one_round_is_weighted_average(cfg, "mdlm");
  // The task's model is an MDLM checkpoint, and its evaluation a NELBO with a denoising accuracy.
  auto task = SimTask::create(cfg, "mdlm.toml");
  REQUIRE(task.ok());
  const auto loaded = saved_and_loaded(**task, "mdlm", 3, load_mdlm);
  CHECK(loaded.model->config().n_embd == 16);
  CHECK(loaded.info.iter == 3);
  const TaskEval e = (*task)->evaluate((*task)->initial_model());
  CHECK(e.loss > 0);
  CHECK(e.accuracy >= 0);
  CHECK(e.accuracy <= 1);
}

TEST_CASE("federated GPT and MDLM train with rotary positions (model.pos_encoding)", "[sim]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  auto cfg = parse(kMdlm);
  cfg.mutable_model()->set_pos_encoding(v1::ModelConfig::ROPE);
  check_one_round_is_weighted_average(cfg, "mdlm_rope");
  auto task = SimTask::create(cfg, "mdlm_rope.toml");
  REQUIRE(task.ok());
  for (const auto& t : (*task)->layout()) CHECK(t.name != "transformer.wpe.weight");
  CHECK(saved_and_loaded(**task, "mdlm_rope", 1, load_mdlm).model->config().rope);

  auto gpt = cfg;
  gpt.mutable_model()->set_arch(v1::FedModelConfig::GPT);
  gpt.mutable_model()->clear_local_optimizer();
  gpt.mutable_model()->clear_diffusion();
  auto gtask = SimTask::create(gpt, "gpt_rope.toml");
  INFO(gtask.status().to_string());
  REQUIRE(gtask.ok());
  for (const auto& t : (*gtask)->layout()) CHECK(t.name != "transformer.wpe.weight");
  CHECK(saved_and_loaded(**gtask, "gpt_rope", 1, load_gpt).model->config().rope);

  auto odd = cfg;
  odd.mutable_model()->set_n_head(16);  // head size 1
  auto bad = SimTask::create(odd, "odd.toml");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Contains("model.pos_encoding"));
}

TEST_CASE("federated block diffusion (model.diffusion.block_length)", "[sim]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  auto cfg = parse(kMdlm);
  cfg.mutable_model()->mutable_diffusion()->set_block_length(4);
  cfg.mutable_model()->mutable_diffusion()->set_masking(v1::DiffusionConfig::COUNT);
  check_one_round_is_weighted_average(cfg, "mdlm_bd3");
  auto task = SimTask::create(cfg, "mdlm_bd3.toml");
  REQUIRE(task.ok());
  const auto loaded = saved_and_loaded(**task, "mdlm_bd3", 1, load_mdlm);
  CHECK(loaded.model->config().block_length == 4);
  CHECK(loaded.model->config().num_blocks() == 4);
  CHECK((*task)->evaluate((*task)->initial_model()).loss > 0);

  auto odd = cfg;
  odd.mutable_model()->mutable_diffusion()->set_block_length(5);  // does not divide 16
  auto bad = SimTask::create(odd, "odd.toml");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Contains("diffusion.block_length"));
}

TEST_CASE("a federated DDPM round is the weighted average of its clients' updates", "[sim]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  auto cfg = parse(kDdpm);
  check_one_round_is_weighted_average(cfg, "ddpm");
  auto task = SimTask::create(cfg, "ddpm.toml");
  REQUIRE(task.ok());
  const auto loaded = saved_and_loaded(**task, "ddpm", 2, load_ddpm);
  CHECK(loaded.model->config().unet.base_channels == 4);
  CHECK_FALSE(loaded.model->has_ema());
  const TaskEval e = (*task)->evaluate((*task)->initial_model());
  CHECK(e.loss > 0.5);  // an untrained denoiser explains little of the noise
  CHECK(e.accuracy == Approx(1.0 - e.loss));
}

TEST_CASE("a DDPM edge client loads only its partition and trains as the task's client does",
          "[sim]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  auto cfg = parse(kDdpm);
  cfg.mutable_eval()->set_every_rounds(0);
  auto task = SimTask::create(cfg, "ddpm.toml");
  REQUIRE(task.ok());
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_local_steps(2);
  plan.set_batch_size(2);
  plan.set_learning_rate(0.05f);
  plan.set_seed(77);
  const auto global = (*task)->initial_model();
  for (int k : {0, 2}) {
    int64_t images = 0;
    auto own = make_ddpm_client_trainer(cfg, "ddpm.toml", k, &images);
    INFO(own.status().to_string());
    REQUIRE(own.ok());
    auto shared = (*task)->make_trainer(k);
    std::vector<float> a(global.size()), b(global.size());
    auto ra = (*own)->train(global, plan, a);
    auto rb = shared->train(global, plan, b);
    REQUIRE(ra.ok());
    REQUIRE(rb.ok());
    CHECK(ra->num_samples == static_cast<uint64_t>(images));
    CHECK(ra->num_samples == rb->num_samples);
    CHECK(ra->loss == rb->loss);
    CHECK(a == b);  // bit for bit: the same images in the same order
    CHECK(std::any_of(a.begin(), a.end(), [](float x) { return x != 0.0f; }));
  }
  int64_t images = 0;
  auto outside = make_ddpm_client_trainer(cfg, "ddpm.toml", 3, &images);
  REQUIRE_FALSE(outside.ok());
  CHECK_THAT(outside.status().message(), Contains("ddpm.toml") && Contains("partition 3"));
  cfg.mutable_model()->mutable_ddpm()->set_image_size(32);
  auto wrong = make_ddpm_client_trainer(cfg, "ddpm.toml", 0, &images);
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.status().message(), Contains("model.ddpm.image_size"));
}

TEST_CASE("diffusion federation config errors name the key", "[sim]") {
  auto ddpm = parse(kDdpm);
  auto message = [](const v1::FederationConfig& c) {
    return aggregator::validate_federation_config(c, "bad.toml").message();
  };
  CHECK(aggregator::validate_federation_config(ddpm, "ok.toml").ok());
  auto c = ddpm;
  c.mutable_model()->mutable_ddpm()->set_groups(3);  // does not divide 4 channels
  CHECK_THAT(message(c), Contains("bad.toml") && Contains("model.ddpm.groups"));
  c = ddpm;
  c.mutable_data()->set_dataset("shakespeare");
  CHECK_THAT(message(c), Contains("model.arch"));
  c = ddpm;
  c.mutable_model()->set_local_optimizer(v1::FedModelConfig::ADAMW);
  c.mutable_local()->set_prox_mu(0.1f);
  CHECK_THAT(message(c), Contains("local.prox_mu"));
  c = ddpm;
  c.mutable_model()->mutable_diffusion()->set_eps(0.5f);
  CHECK_THAT(message(c), Contains("model.diffusion") && Contains("MDLM only"));

  auto mdlm = parse(kMdlm);
  CHECK(aggregator::validate_federation_config(mdlm, "ok.toml").ok());
  c = mdlm;
  c.mutable_model()->mutable_diffusion()->set_eps(1.5f);
  CHECK_THAT(message(c), Contains("model.diffusion.eps"));
  c = mdlm;
  c.mutable_model()->set_n_embd(15);
  CHECK_THAT(message(c), Contains("model.n_embd"));
  c = mdlm;
  c.mutable_model()->set_arch(v1::FedModelConfig::MLP);
  CHECK_THAT(message(c), Contains("model.arch") && Contains("model.local_optimizer"));
  // A table under [model] that the schema lacks is an error naming it.
  v1::FederationConfig unknown;
  CHECK_THAT(config::parse_toml("[model.ddpm]\nwidth = 3\n", "u.toml", &unknown).message(),
             Contains("u.toml") && Contains("width"));
}

TEST_CASE("the federated diffusion configs load", "[sim]") {
  int found = 0;
  for (const char* name : {"fed_mdlm_roles8.toml", "fed_ddpm_mnist_dir8.toml"}) {
    INFO(name);
    auto c = aggregator::load_federation_config(fs::path(STARLING_SOURCE_DIR) / "configs" / name);
    INFO(c.status().to_string());
    REQUIRE(c.ok());
    CHECK(c->data().num_clients() == 8);
    CHECK(c->local().codec() != "identity");
    ++found;
  }
  CHECK(found == 2);
}

}  // namespace
}  // namespace starling::sim
