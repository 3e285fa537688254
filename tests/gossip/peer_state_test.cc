// The gossip peer's crash-safe state file: a round trip keeps every field exactly (hex-float
// weights included), and a missing, torn, edited or foreign file is refused with its name.
#include "gossip/peer_state.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/io/safetensors.h"

namespace starling::gossip {
namespace {

namespace fs = std::filesystem;

compress::Layout tiny_layout() { return {{"w", {2, 3}, 0}, {"b", {3}, 6}}; }

PeerState tiny_state() {
  PeerState s;
  s.node_id = "peer-1";
  s.algorithm = "dpsgd";
  s.codec = "int8:block=64,ef=1";
  s.round = 5;
  s.messages_made = 5;
  s.params = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  s.codec_state = {0.5f, -0.25f, 0, 0, 0, 0, 0, 0, 1e-7f};
  s.members = {{"peer-0", "127.0.0.1:4000"}, {"peer-1", "127.0.0.1:4001"}};
  SavedRound r;
  r.round = 4;
  r.msg = std::string("\x01\x00\xffmessage", 10);
  r.degree = 2;
  r.sent_to = {"peer-0"};
  r.missed = {{"peer-2", 1.0 / 3.0}, {"peer-3", -1.0}};
  r.own = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  s.past.push_back(r);
  return s;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("starling_peer_state_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("peer state: a round trip keeps every field exactly", "[gossip]") {
  TempDir dir;
  const PeerState s = tiny_state();
  REQUIRE(save_peer_state(dir.path, tiny_layout(), s).ok());
  REQUIRE(fs::exists(dir.path / kPeerModelFile));
  auto back = load_peer_state(dir.path, tiny_layout(), "peer-1", "dpsgd", "int8:block=64,ef=1");
  REQUIRE(back.ok());
  CHECK(back->round == 5);
  CHECK(back->messages_made == 5);
  CHECK(back->params == s.params);
  CHECK(back->public_copy.empty());
  CHECK(back->codec_state == s.codec_state);
  CHECK(back->members == s.members);
  REQUIRE(back->past.size() == 1);
  CHECK(back->past[0].round == 4);
  CHECK(back->past[0].msg == s.past[0].msg);
  CHECK(back->past[0].degree == 2);
  CHECK(back->past[0].sent_to == s.past[0].sent_to);
  CHECK(back->past[0].missed == s.past[0].missed);  // 1/3 to the last bit
  CHECK(back->past[0].own == s.past[0].own);
  // The model file users read carries the layout's tensor names.
  auto model = io::load_safetensors(dir.path / kPeerModelFile);
  REQUIRE(model.ok());
  REQUIRE(model->tensors.size() == 2);
  CHECK(model->metadata.at("round") == "5");
}

TEST_CASE("peer state: missing, torn, edited and foreign files are refused by name", "[gossip]") {
  TempDir dir;
  const auto layout = tiny_layout();
  const std::string codec = "int8:block=64,ef=1";
  SECTION("none yet: NotFound (a first start)") {
    auto r = load_peer_state(dir.path, layout, "peer-1", "dpsgd", codec);
    CHECK(r.status().code() == StatusCode::kNotFound);
  }
  REQUIRE(save_peer_state(dir.path, layout, tiny_state()).ok());
  const fs::path file = dir.path / kPeerStateFile;
  SECTION("another node's, algorithm's or codec's") {
    auto other = load_peer_state(dir.path, layout, "peer-2", "dpsgd", codec);
    CHECK(other.status().code() == StatusCode::kFailedPrecondition);
    CHECK(other.status().message().find("peer-1") != std::string::npos);
    CHECK(load_peer_state(dir.path, layout, "peer-1", "choco", codec).status().code() ==
          StatusCode::kFailedPrecondition);
    CHECK(load_peer_state(dir.path, layout, "peer-1", "dpsgd", "identity").status().code() ==
          StatusCode::kFailedPrecondition);
  }
  SECTION("a model of another size") {
    const compress::Layout bigger = {{"w", {2, 3}, 0}, {"b", {4}, 6}};
    auto r = load_peer_state(dir.path, bigger, "peer-1", "dpsgd", codec);
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK(r.status().message().find(file.string()) != std::string::npos);
  }
  SECTION("one byte of a tensor changed") {
    std::string bytes;
    {
      std::ifstream in(file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    bytes[bytes.size() - 3] ^= 0x10;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    auto r = load_peer_state(dir.path, layout, "peer-1", "dpsgd", codec);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find(file.string()) != std::string::npos);
  }
  SECTION("torn: cut in half") {
    const auto size = fs::file_size(file);
    fs::resize_file(file, size / 2);
    auto r = load_peer_state(dir.path, layout, "peer-1", "dpsgd", codec);
    CHECK(!r.ok());
    CHECK(r.status().message().find(kPeerStateFile) != std::string::npos);
  }
}

}  // namespace starling::gossip
