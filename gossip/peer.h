// A gossip peer over mutual TLS: it listens for neighbours, joins through seed peers, keeps a
// heartbeat membership, lays the topology over the sorted live member ids each round, and runs
// D-PSGD, CHOCO-SGD or asynchronous push-pull with the same GossipNode as the simulation.
//
// Protocol (core/wire/messages.proto): every connection opens with Hello (role PEER, the node
// id of the certificate). GossipMembership is sent on every link each heartbeat period.
// GossipExchange announces a payload that follows as Chunks (a serialized EncodedUpdate):
// GOSSIP_ROUND (round r's message, with the sender's degree), GOSSIP_SNAPSHOT (CHOCO: the
// sender's whole public copy, sent first on every new connection), GOSSIP_PUSH / GOSSIP_PULL
// (push-pull), GOSSIP_CATCH_UP_REQUEST / GOSSIP_CATCH_UP (a joining peer copies a neighbour's
// model and round). Of two connections between the same pair, the one the lower id dialed wins.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/net/server.h"
#include "edge_client/edge_client.h"
#include "gossip/node.h"
#include "gossip/topology.h"

namespace starling::gossip {

using Millis = std::chrono::milliseconds;

struct PeerOptions {
  std::string node_id;  // must equal our certificate's CN
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  std::string advertise_host;      // empty: listen_host
  std::vector<std::string> seeds;  // host:port
  std::string seed_server_name;    // identity seed certificates carry; empty: the seed's host
  Millis heartbeat{500};
  Millis fail_timeout{4000};
  Millis round_timeout{10000};
  Millis linger{2000};
  Millis round_interval{0};  // rounds start at least this far apart
  uint32_t min_peers = 1;
  uint32_t num_rounds = 10;
  NodeOptions node;
  TopologySpec topology;
  uint32_t local_steps = 10;
  uint32_t batch_size = 32;
  float learning_rate = 0.05f;
  // Cosine decay to learning_rate * final_lr_fraction over num_rounds (scheduled_learning_rate).
  float final_lr_fraction = 1.0f;
  uint64_t seed = 1;
  uint32_t chunk_bytes = 1u << 20;
  // Crash-safe state (gossip/peer_state.h); empty: none. With a state there, create() resumes
  // from it: the model and round it saved, no catch-up, its recent messages resent.
  std::string state_dir;
  // Fault injection for crash tests: "STAGE@ROUND" makes the process SIGKILL itself at that
  // stage of that (1-based) round: trained (local training done, no message made), sent (the
  // round's message queued to the neighbours), mixed (the round mixed, its state not written),
  // saved (the state written, the round hook not run). `starling peer` reads it from
  // $STARLING_CRASH_POINT.
  std::string crash_point;
};

struct PeerRoundReport {
  uint64_t round = 0;  // 1-based count of completed rounds
  size_t live_members = 0;
  size_t neighbours = 0;  // expected senders this round
  size_t mixed = 0;       // messages actually mixed
  double train_loss = 0.0;
  uint64_t bytes_sent = 0;  // payload bytes (encoded updates) since start
  double seconds = 0.0;
  bool caught_up = false;  // this round started from a neighbour's model
  bool resumed = false;    // this round started from our own saved state
};

// Not thread-safe: everything (training included) runs on the io_context thread, so a round's
// local training should stay well below the failure timeout.
class Peer {
 public:
  using RoundHook = std::function<void(const PeerRoundReport&, std::span<const float> params)>;

  // Binds the listening socket. `trainer` may be null (pure averaging); it must outlive the peer.
  static Result<std::unique_ptr<Peer>> create(asio::io_context& io,
                                              std::shared_ptr<asio::ssl::context> server_ctx,
                                              std::shared_ptr<asio::ssl::context> client_ctx,
                                              PeerOptions options, compress::Layout layout,
                                              std::vector<float> initial,
                                              edge_client::LocalTrainer* trainer, RoundHook hook);
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // Starts heartbeats, dials the seeds, and begins round 0 once min_peers are alive.
  void start();
  // Announces a leave, closes every link, and stops.
  void stop();
  // All rounds done and the linger period over, or stopped, or failed (see error()).
  bool done() const;
  const Status& error() const;
  uint16_t port() const;
  uint64_t rounds_completed() const;
  std::vector<std::string> live_members() const;
  std::span<const float> params() const;
  uint64_t bytes_sent() const;
  // The round the saved state put us at (0: started afresh).
  uint64_t resumed_at() const;
  // Drops at once every link (registered or awaiting its Hello) whose peer certificate has one
  // of these serials (upper-case hex): after a CRL reload, revoked peers are cut off without
  // waiting for their next handshake. Returns how many were dropped.
  size_t drop_revoked(const std::set<std::string>& serials);

  struct Impl;

 private:
  explicit Peer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// Starts `peer` and runs `io` until it is done, then 200 ms more so its closing messages go
// out; returns peer.error().
Status run_peer_to_end(asio::io_context& io, Peer& peer);

}  // namespace starling::gossip
