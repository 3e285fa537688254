// Gossip peers training a federation's model kind (task.kind FEDERATED): LoRA adapters on a
// pretrained GPT (the tiny GPT-2 that transformers wrote), exchanged alone, lower the loss.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "gossip/task.h"
#include "sim/gossip_tasks.h"

namespace starling::sim {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

v1::GossipConfig lora_gossip(const std::string& extra = "") {
  const std::string base =
      (fs::path(STARLING_SOURCE_DIR) / "tests" / "fixtures" / "hf_gpt2_tiny").string();
  v1::GossipConfig c;
  REQUIRE(config::parse_toml("[topology]\nkind = \"RING\"\n[algorithm]\nkind = \"DPSGD\"\n"
                             "codec = \"int8:ef=1\"\n[rounds]\nnum_rounds = 4\n"
                             "[local]\nlocal_steps = 4\nbatch_size = 4\nlearning_rate = 0.01\n"
                             "[task]\nkind = \"FEDERATED\"\n"
                             "[data]\ndataset = \"shakespeare\"\npartition = \"ROLES\"\n"
                             "[model]\narch = \"GPT\"\ninit_from = \"hf:" +
                                 base +
                                 "\"\nblock_size = 32\nlocal_optimizer = \"ADAMW\"\n"
                                 "[lora]\nrank = 4\nalpha = 8\n"
                                 "[eval]\nevery_rounds = 0\nmax_examples = 16\n"
                                 "[simulate]\nnum_peers = 3\n" +
                                 extra,
                             "lora_gossip.toml", &c)
              .ok());
  return c;
}

bool have_shakespeare() {
  auto dir = data::resolve_data_dir("");
  std::error_code ec;
  return dir.ok() && fs::exists(*dir / "tinyshakespeare" / "input.txt", ec);
}

TEST_CASE("gossip: peers fine-tune LoRA adapters on a pretrained GPT and gossip them alone",
          "[sim][gossip][lora]") {
  if (!have_shakespeare()) return;
  register_gossip_model_tasks();
  const v1::GossipConfig c = lora_gossip();
  REQUIRE(gossip::validate_gossip_config(c, "lora_gossip.toml").ok());
  auto task = gossip::GossipTask::create(c, 3, true, false);
  REQUIRE(task.ok());
  CHECK((*task)->trains());
  // The exchanged vector is the adapters: 2 blocks x 4 projections x (A, B) of rank 4.
  const auto& layout = (*task)->layout();
  REQUIRE(layout.size() == 16);
  for (const auto& e : layout) CHECK_THAT(e.name, Contains(".lora_"));
  CHECK((*task)->initial(0).size() == 4096);
  CHECK((*task)->initial(0) == (*task)->initial(2));  // every peer starts from the base
  // FedAvg weights: the tokens of each peer's role, not 1.
  CHECK((*task)->examples(0) > 100);
  CHECK((*task)->examples(0) != (*task)->examples(1));
  const double base_loss = (*task)->evaluate((*task)->initial(0)).loss;

  std::vector<nlohmann::json> lines;
  auto s = gossip::run_simulation(
      c, [&](const std::string& l) { lines.push_back(nlohmann::json::parse(l)); });
  REQUIRE(s.ok());
  REQUIRE(lines.size() == 4);
  CHECK(s->mean_model_eval.loss < base_loss);
  // 3 peers x 4 rounds x 2 ring neighbours of 4,096 int8 values and their scales: far below
  // the 36,736-float model each round would move without LoRA.
  CHECK(s->total_bytes < 3 * 4 * 2 * 36736 * 4 / 4);
}

TEST_CASE("gossip: [lora] is refused outside task.kind FEDERATED, and bad keys are named",
          "[sim][gossip][lora]") {
  register_gossip_model_tasks();
  v1::GossipConfig c = lora_gossip();
  c.mutable_task()->set_kind(v1::GossipTaskConfig::MNIST);
  CHECK_THAT(gossip::validate_gossip_config(c, "g.toml").message(), Contains("lora.rank"));
  if (!have_shakespeare()) return;
  c = lora_gossip();
  c.mutable_model()->set_n_embd(64);  // the base has 32
  auto t = gossip::GossipTask::create(c, 3, true, false);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Contains("model.n_embd") && Contains("has 32"));
}

TEST_CASE("gossip: a peer on a GPU that is not there is an error naming [peer]'s key",
          "[sim][gossip]") {
  if (!have_shakespeare()) return;
  register_gossip_model_tasks();
  v1::GossipConfig c = lora_gossip();
  c.clear_lora();  // LoRA trains on the CPU engine only
  c.mutable_peer()->set_device("cuda");
  c.mutable_peer()->add_gpus(97);
  REQUIRE(gossip::validate_gossip_config(c, "g.toml").ok());
  // One peer (its own data-parallel GPUs) and a simulation (peers spread over them) alike.
  for (bool one_peer : {true, false}) {
    auto t = gossip::GossipTask::create(c, 3, true, one_peer);
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(t.status().message(), Contains("'peer.device'") && Contains("cuda"));
    CHECK_THAT(t.status().message(), !Contains("client.device"));
  }
}

}  // namespace
}  // namespace starling::sim
