// The algorithm state of one gossip node, shared by the in-process simulation and the networked
// peer: its model x, the codec of its messages and, for CHOCO-SGD, the public copies x^ of itself
// and of its neighbours. Messages are serialized EncodedUpdates (core/compress), so every byte
// counted in a simulation is a byte the wire would carry.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"

namespace starling::gossip {

enum class Algorithm {
  // D-PSGD (Lian et al. 2017): local steps, then x_i <- sum_j w_ij codec(x_j) (own x exact).
  kDpsgd,
  // Asynchronous push-pull gossip (Boyd et al. 2006): a node and one random neighbour swap
  // codec(x) and both keep the pairwise average.
  kPushPull,
  // CHOCO-SGD (Koloskova et al. 2019): q_i = codec(x_i - x^_i) is sent, every holder of x^_i adds
  // q_i, then x_i <- x_i + gamma sum_j w_ij (x^_j - x^_i). The gap x - x^ is the error feedback.
  kChoco,
  // Centralized FedAvg reference (simulation only): the sample-weighted exact mean of all nodes.
  kFedAvg,
};

std::string_view algorithm_name(Algorithm a);              // "dpsgd", "push_pull", ...
Result<Algorithm> parse_algorithm(std::string_view name);  // case-insensitive

struct NodeOptions {
  Algorithm algorithm = Algorithm::kDpsgd;
  // Codec spec (core/compress/spec.h) of the node's messages. CHOCO refuses ef=1: x - x^ already
  // is its error memory.
  std::string codec = "identity";
  double consensus_step = 1.0;  // CHOCO gamma, in (0, 1]
  // CHOCO: every node starts from the same model (e.g. one seeded initialization), so the public
  // copies x^ start there instead of at zero and the first rounds need not send the model itself.
  // REQUIRES: the same initial model on every node (Simulation checks it).
  bool shared_init = false;
  uint64_t seed = 1;  // codec randomness
};

// One received message: who sent it, with what mixing weight, and whether it is a snapshot (the
// sender's whole x^, sent when a CHOCO link is new) rather than an increment.
struct Incoming {
  std::string from;
  const compress::EncodedUpdate* update = nullptr;
  double weight = 0.0;
  bool snapshot = false;
};

// Not thread-safe.
class GossipNode {
 public:
  // `initial` has the layout's numel. InvalidArgument for a bad codec spec or option.
  static Result<std::unique_ptr<GossipNode>> create(const NodeOptions& options,
                                                    compress::Layout layout,
                                                    std::vector<float> initial);

  std::span<float> params() { return x_; }
  std::span<const float> params() const { return x_; }
  const compress::Layout& layout() const { return layout_; }
  const NodeOptions& options() const { return options_; }

  // This round's message to the neighbours: codec(x) (D-PSGD, push-pull), or q = codec(x - x^)
  // with x^ += decode(q) (CHOCO). Call once per round; every neighbour gets the same bytes.
  Result<std::string> make_message();
  // CHOCO: the whole x^ of this node, identity-coded, for a neighbour that has no copy yet.
  std::string snapshot() const;

  // D-PSGD: x <- self_weight x + sum weight_j decode(update_j). CHOCO: absorbs each entry that
  // carries an update, then x <- x + gamma sum_j weight_j (x^_j - x^_self) over the entries (an
  // entry without an update uses the copy absorbed earlier). FailedPrecondition for a sender
  // with no copy. On error x is unchanged.
  Status mix(double self_weight, std::span<const Incoming> incoming);
  // CHOCO: applies one increment (or snapshot) to the sender's public copy. Increments must be
  // absorbed in the order they were made, each exactly once. FailedPrecondition for an increment
  // from a sender with no copy (its snapshot was lost).
  Status absorb(const Incoming& in);
  // D-PSGD: folds in a neighbour's message of a round this node already mixed without it:
  // x <- x + weight (decode(update) - own), `own` being this node's model as it was mixed that
  // round. The node ends where a timely mix would have put it, so with symmetric weights the sum
  // over nodes is kept. InvalidArgument when `own` has the wrong size; on error x is unchanged.
  Status mix_late(const compress::EncodedUpdate& update, std::span<const float> own, double weight);
  // Push-pull: x <- (x + decode(other)) / 2.
  Status pair_average(const compress::EncodedUpdate& other);
  // Replaces x (catch-up from a neighbour's model); CHOCO public copies are kept.
  Status set_params(std::span<const float> x);

  // What a restart must restore to go on exactly where the node was: CHOCO's own public copy
  // (empty otherwise) and the codec's persistent_state() (the error-feedback residual).
  std::span<const float> public_copy() const { return xhat_; }
  std::span<const float> codec_state() const { return codec_->persistent_state(); }
  // Restores x, the public copy and the codec state saved from a node made with the same
  // options and layout. InvalidArgument when a size does not match; on error nothing changes.
  Status restore(std::span<const float> x, std::span<const float> public_copy,
                 std::span<const float> codec_state);

  // CHOCO: whether a public copy of `peer` is held; forget() drops it (the link went away).
  bool has_copy(const std::string& peer) const { return copies_.count(peer) > 0; }
  void forget(const std::string& peer) { copies_.erase(peer); }
  // CHOCO: records that `peer`'s x^ is still at its initial value, known to everyone (zero, or
  // the shared starting model with shared_init), so its first increments need no snapshot.
  void assume_initial_copy(const std::string& peer) { copies_[peer] = xhat0_; }

 private:
  GossipNode(NodeOptions options, compress::Layout layout, std::vector<float> x,
             std::unique_ptr<compress::Codec> codec);

  NodeOptions options_;
  compress::Layout layout_;
  std::vector<float> x_;
  std::vector<float> xhat_;                           // CHOCO: own public copy
  std::vector<float> xhat0_;                          // CHOCO: every public copy's starting value
  std::map<std::string, std::vector<float>> copies_;  // CHOCO: neighbours' public copies
  std::unique_ptr<compress::Codec> codec_;
  compress::EncodedUpdate encoded_;
  std::vector<float> scratch_;
};

// Parses a message from a peer. DataLoss naming `from` for malformed bytes; InvalidArgument when
// its size is not `numel`.
Result<compress::EncodedUpdate> parse_message(std::string_view bytes, int64_t numel,
                                              std::string_view from);

}  // namespace starling::gossip
