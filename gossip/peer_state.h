// What a gossip peer keeps on disk so that a SIGKILL or power loss costs it no completed round:
// after every round, <state_dir>/model.safetensors (the model, tensor names of the layout) and
// then <state_dir>/peer_state.safetensors, the commit point: the round count, the model, the
// codec's error-feedback residual, CHOCO's public copy, the members it last saw (ids and
// addresses, so a restarted peer can find them without a seed) and its recent rounds' messages
// (D-PSGD: resent to neighbours that lost them with the connection). Both are written
// atomically (temporary file, fsync, rename); the state carries a SHA-256 of every field, so a
// torn or edited file is refused on load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"

namespace starling::gossip {

inline constexpr const char* kPeerStateFile = "peer_state.safetensors";  // the commit point
inline constexpr const char* kPeerModelFile = "model.safetensors";       // model only, for users

// One recent D-PSGD round: the message we sent, to whom, and what we mixed it against when a
// neighbour's message was missing (for a late one).
struct SavedRound {
  uint64_t round = 0;
  std::string msg;  // serialized EncodedUpdate
  uint32_t degree = 0;
  std::vector<std::string> sent_to;
  std::map<std::string, double> missed;  // expected sender -> weight (< 0: Metropolis-Hastings)
  std::vector<float> own;
};

struct PeerState {
  std::string node_id;
  std::string algorithm;  // algorithm_name()
  std::string codec;      // the node's codec spec
  uint64_t round = 0;     // rounds completed
  uint64_t messages_made = 0;
  std::vector<float> params;
  std::vector<float> public_copy;  // CHOCO x^; empty otherwise
  std::vector<float> codec_state;  // the codec's persistent_state(); empty when none
  std::vector<std::pair<std::string, std::string>> members;  // live ids (ourselves included)
  std::vector<SavedRound> past;
};

// Writes <dir>/model.safetensors and then <dir>/peer_state.safetensors. Creates `dir`.
Status save_peer_state(const std::filesystem::path& dir, const compress::Layout& layout,
                       const PeerState& state);

// Reads <dir>/peer_state.safetensors. NotFound when there is none (a first start); DataLoss
// naming the file when it is torn, edited or malformed; FailedPrecondition when it belongs to
// another node, algorithm or codec, or its model does not fit `layout`.
Result<PeerState> load_peer_state(const std::filesystem::path& dir, const compress::Layout& layout,
                                  const std::string& node_id, const std::string& algorithm,
                                  const std::string& codec);

}  // namespace starling::gossip
