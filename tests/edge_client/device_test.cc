// Device awareness of the edge client: memory figures, the memory budget, the training
// condition (file and command), and the client state file (round trip, tampering, ownership).
#include "edge_client/device.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/compress/codec.h"
#include "edge_client/client_state.h"

namespace starling::edge_client {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("starling_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

TEST_CASE("resident memory is read from /proc and the budget refuses what does not fit",
          "[edge_client]") {
  auto rss = current_rss_bytes();
  auto peak = peak_rss_bytes();
  REQUIRE(rss.ok());
  REQUIRE(peak.ok());
  CHECK(*rss > (1u << 20));
  CHECK(*peak >= *rss);
  CHECK(MemoryBudget{0}.check(uint64_t{1} << 40, "x").ok());  // no limit
  CHECK(MemoryBudget{*rss + (256u << 20)}.check(1u << 20, "a round").ok());
  const Status st = MemoryBudget{*rss + (1u << 20)}.check(64u << 20, "round 3's training");
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(st.message(),
             Catch::Contains("round 3's training") && Catch::Contains("memory_limit_mb"));
}

TEST_CASE("the training condition reads a file and runs a command", "[edge_client]") {
  const auto dir = temp_dir("condition");
  TrainingCondition c;
  CHECK(c.empty());
  CHECK(*c.allows());
  c.file = (dir / "on_ac").string();
  std::string why;
  CHECK_FALSE(*c.allows(&why));
  CHECK_THAT(why, Catch::Contains("does not exist"));
  std::ofstream(c.file) << "1\n";
  CHECK(*c.allows());
  std::ofstream(c.file) << "0\n";
  CHECK_FALSE(*c.allows(&why));
  CHECK_THAT(why, Catch::Contains("says '0'"));
  std::ofstream(c.file) << "yes\n";
  CHECK(*c.allows());

  c.command = "test -e " + (dir / "idle").string();
  CHECK_FALSE(*c.allows(&why));
  CHECK_THAT(why, Catch::Contains("exited with 1"));
  std::ofstream(dir / "idle") << "";
  CHECK(*c.allows());
  c.command = "sleep 5";
  c.timeout = std::chrono::milliseconds(100);
  CHECK_FALSE(*c.allows(&why));
  CHECK_THAT(why, Catch::Contains("timed out"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the client state round-trips and refuses tampering or another node", "[edge_client]") {
  const auto dir = temp_dir("state");
  const auto path = dir / "client-1.state.safetensors";
  CHECK(load_client_state(path, "client-1").status().code() == StatusCode::kNotFound);
  ClientState s;
  s.node_id = "client-1";
  s.rounds_trained = 7;
  s.last_round = 12;
  s.codec_state["topk:ratio=0.01,ef=1"] = {0.5f, -1.25f, 3.0f};
  s.codec_state["int8:ef=1"] = {1e-3f};
  REQUIRE(save_client_state(path, s).ok());
  auto back = load_client_state(path, "client-1");
  REQUIRE(back.ok());
  CHECK(back->rounds_trained == 7);
  CHECK(back->last_round == 12);
  CHECK(back->codec_state == s.codec_state);

  CHECK(load_client_state(path, "client-2").status().code() == StatusCode::kFailedPrecondition);

  // Flip one byte of a residual: the checksum catches it.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 2] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  auto bad = load_client_state(path, "client-1");
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Catch::Contains(path.string()));
  // A truncated file is refused too.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  CHECK(load_client_state(path, "client-1").status().code() == StatusCode::kDataLoss);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an error-feedback codec's residual is its persistent state", "[edge_client]") {
  const compress::Layout layout = {{"w", {8}, 0}};
  auto a = compress::make_codec("topk:ratio=0.25,ef=1", layout, 1);
  auto b = compress::make_codec("topk:ratio=0.25,ef=1", layout, 1);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::vector<float> d1 = {1, -2, 3, -4, 5, -6, 7, -8};
  const std::vector<float> d2 = {0.5f, 0.25f, -1, 2, -3, 1, 0, 4};
  REQUIRE((*a)->encode(d1).ok());
  const auto st = (*a)->persistent_state();
  REQUIRE(st.size() == 8);
  // b takes over a's state: both then encode the next delta identically.
  REQUIRE((*b)->restore_state(st).ok());
  auto ea = (*a)->encode(d2);
  auto eb = (*b)->encode(d2);
  REQUIRE(ea.ok());
  REQUIRE(eb.ok());
  std::vector<float> da(8), db(8);
  REQUIRE(compress::decode(*ea, da).ok());
  REQUIRE(compress::decode(*eb, db).ok());
  CHECK(da == db);
  CHECK((*b)->restore_state(std::vector<float>(3)).code() == StatusCode::kInvalidArgument);
  std::vector<float> nan_state(8, 0.0f);
  nan_state[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK((*b)->restore_state(nan_state).code() == StatusCode::kInvalidArgument);
  auto plain = compress::make_codec("identity", layout, 1);
  REQUIRE(plain.ok());
  CHECK((*plain)->persistent_state().empty());
  CHECK((*plain)->restore_state({}).ok());
  CHECK_FALSE((*plain)->restore_state(st).ok());
}

}  // namespace
}  // namespace starling::edge_client
