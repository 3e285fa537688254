// Gossip configs (every configs/gossip_*.toml loads; bad values are named), untrusted messages,
// and a tiny simulated MNIST gossip run through the same entry point as `starling peer
// --simulate`.
#include "gossip/task.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/config/toml_config.h"
#include "core/wire/envelope.h"

using namespace starling;
using namespace starling::gossip;
namespace fs = std::filesystem;

TEST_CASE("gossip config: every configs/gossip_*.toml loads and validates", "[gossip]") {
  int found = 0;
  for (const auto& e : fs::directory_iterator(fs::path(STARLING_SOURCE_DIR) / "configs")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("gossip_", 0) != 0 || e.path().extension() != ".toml") continue;
    ++found;
    INFO(name);
    auto c = load_gossip_config(e.path());
    REQUIRE(c.ok());
    REQUIRE(c->data().num_clients() > 0);
  }
  REQUIRE(found >= 4);
}

TEST_CASE("gossip config: bad values and keys are errors naming the key", "[gossip]") {
  v1::GossipConfig c;
  REQUIRE(config::parse_toml("[topology]\nkind = \"STAR\"\n", "t.toml", &c).code() ==
          StatusCode::kInvalidArgument);
  REQUIRE_THAT(config::parse_toml("[peer]\nheartbeat = 5\n", "t.toml", &c).message(),
               Catch::Contains("t.toml:2") && Catch::Contains("peer.heartbeat"));
  REQUIRE(config::parse_toml("[algorithm]\nkind = \"CHOCO\"\ncodec = \"topk:ratio=2\"\n"
                             "[topology]\ntime_varying = true\n[peer]\nseeds = [\"nohost\"]\n"
                             "fail_timeout_ms = 100\nheartbeat_ms = 200\n"
                             "[local]\nfinal_lr_fraction = 1.5\n",
                             "t.toml", &c)
              .ok());
  const Status st = validate_gossip_config(c, "t.toml");
  REQUIRE(st.code() == StatusCode::kInvalidArgument);
  for (const char* key : {"algorithm.codec", "topology.time_varying", "peer.seeds",
                          "peer.fail_timeout_ms", "local.final_lr_fraction"}) {
    REQUIRE_THAT(st.message(), Catch::Contains(std::string("'") + key + "'"));
  }
  // Where the trainer runs: "cpu" or "cuda", the GPU for the federations' model kinds only, and
  // GPUs only with "cuda".
  c = v1::GossipConfig();
  c.mutable_peer()->set_device("tpu");
  CHECK_THAT(validate_gossip_config(c, "t.toml").message(),
             Catch::Contains("'peer.device'") && Catch::Contains("\"cpu\" or \"cuda\""));
  c.mutable_peer()->set_device("cuda");  // task.kind MNIST by default
  CHECK_THAT(validate_gossip_config(c, "t.toml").message(),
             Catch::Contains("'peer.device'") && Catch::Contains("FEDERATED"));
  c.mutable_task()->set_kind(v1::GossipTaskConfig::FEDERATED);
  CHECK(validate_gossip_config(c, "t.toml").ok());
  c.mutable_peer()->set_device("cpu");
  c.mutable_peer()->add_gpus(0);
  CHECK_THAT(validate_gossip_config(c, "t.toml").message(), Catch::Contains("'peer.gpus'"));
}

TEST_CASE("gossip messages: corrupt or mis-sized payloads are errors, never crashes", "[gossip]") {
  NodeOptions o;
  auto node = GossipNode::create(o, compress::flat_layout(8), std::vector<float>(8, 1.0f));
  REQUIRE(node.ok());
  auto msg = (*node)->make_message();
  REQUIRE(msg.ok());
  REQUIRE(parse_message(*msg, 8, "peer-x").ok());
  auto wrong = parse_message(*msg, 9, "peer-x");
  REQUIRE_THAT(wrong.status().message(), Catch::Contains("peer-x") && Catch::Contains("8"));
  REQUIRE(parse_message("\xff\xff\xff garbage", 8, "peer-y").status().code() ==
          StatusCode::kDataLoss);
  for (size_t cut = 0; cut < msg->size(); cut += 3) {
    auto r = parse_message(std::string_view(*msg).substr(0, cut), 8, "peer-z");
    if (r.ok()) REQUIRE(r->numel == 8);
  }
  // A failed mix leaves the model as it was.
  auto other = GossipNode::create(o, compress::flat_layout(9), std::vector<float>(9, 5.0f));
  auto big = compress::parse_update(*(*other)->make_message());
  REQUIRE(big.ok());
  Incoming in{"peer-w", &*big, 0.5, false};
  REQUIRE_FALSE((*node)->mix(0.5, std::span<const Incoming>(&in, 1)).ok());
  for (float v : (*node)->params()) REQUIRE(v == 1.0f);
}

TEST_CASE("gossip simulation: a tiny MNIST federation trains through run_simulation", "[gossip]") {
  v1::GossipConfig c;
  REQUIRE(config::parse_toml(
              "[topology]\nkind = \"RING\"\n[algorithm]\nkind = \"CHOCO\"\n"
              "codec = \"topk:ratio=0.1\"\nconsensus_step = 0.5\n[rounds]\nnum_rounds = 4\n"
              "[local]\nlocal_steps = 25\nbatch_size = 16\nlearning_rate = 0.1\n"
              "[data]\nnum_clients = 4\npartition = \"IID\"\n[model]\nhidden = 32\n"
              "[eval]\nevery_rounds = 0\nmax_examples = 500\n"
              "[simulate]\ncrash_peer = 1\ncrash_round = 1\nrejoin_round = 2\n",
              "tiny.toml", &c)
              .ok());
  REQUIRE(validate_gossip_config(c, "tiny.toml").ok());
  std::vector<nlohmann::json> lines;
  auto s =
      run_simulation(c, [&](const std::string& l) { lines.push_back(nlohmann::json::parse(l)); });
  REQUIRE(s.ok());
  REQUIRE(lines.size() == 4);
  REQUIRE(lines[0]["event"] == "crash peer 1");
  REQUIRE(lines[0]["live_peers"] == 3);
  REQUIRE(lines[1]["event"] == "peer 1 rejoined");
  REQUIRE(lines[1]["live_peers"] == 4);
  REQUIRE(lines[3]["test_accuracy"].size() == 4);
  // 100 SGD steps on a 32-unit 2NN: far above chance (0.1).
  REQUIRE(s->mean_model_eval.accuracy > 0.5);
  REQUIRE(s->total_bytes > 0);
  REQUIRE(lines[3]["train_loss"].get<double>() < 2.0);
}

TEST_CASE("gossip wire: exchange and membership fields round-trip through envelopes", "[gossip]") {
  v1::Envelope e;
  e.set_seq(7);
  auto* g = e.mutable_gossip_exchange();
  g->set_kind(v1::GOSSIP_SNAPSHOT);
  g->set_degree(5);
  g->set_round(12);
  g->set_model_version(40);
  auto bytes = wire::encode_envelope(e, 1 << 20);
  REQUIRE(bytes.ok());
  auto back = wire::decode_envelope(*bytes);
  REQUIRE(back.ok());
  REQUIRE(back->gossip_exchange().kind() == v1::GOSSIP_SNAPSHOT);
  REQUIRE(back->gossip_exchange().degree() == 5);
  REQUIRE(back->gossip_exchange().model_version() == 40);

  v1::Envelope m;
  auto* member = m.mutable_gossip_membership()->add_members();
  member->set_node_id("peer-3");
  member->set_heartbeat(99);
  member->set_left(true);
  auto mb = wire::encode_envelope(m, 1 << 20);
  REQUIRE(mb.ok());
  // An unknown field appended by a newer peer (field 100, varint) is skipped.
  std::string with_unknown = *mb + std::string("\xa0\x06\x01", 3);
  auto mback = wire::decode_envelope(with_unknown);
  REQUIRE(mback.ok());
  REQUIRE(mback->gossip_membership().members(0).heartbeat() == 99);
  REQUIRE(mback->gossip_membership().members(0).left());
}
