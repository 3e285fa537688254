// The edge client loop: connect with this node's certificate, receive a round plan and the
// global model, train locally, send codec(local - global) with error feedback kept across
// rounds, repeat; reconnect with backoff after failures or an aggregator restart.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/net/client.h"
#include "core/util/status.h"
#include "core/wire/messages.pb.h"
#include "edge_client/device.h"

namespace starling::edge_client {

struct TrainReport {
  uint64_t num_samples = 0;  // the update's weight in FedAvg
  float loss = 0.0f;         // mean training loss of the round
};

// Encodes a trainer's update where it lives (LocalTrainer::make_encoder): a GPU trainer's with
// the GPU codecs, so that only the encoded bytes reach the host. The same wire format and, for a
// spec and seed, the same bytes as compress::make_codec on the host, error feedback included.
class UpdateEncoder {
 public:
  virtual ~UpdateEncoder() = default;
  // The update of the trainer's last train() (which was given an empty delta).
  virtual Status encode_into(compress::EncodedUpdate& out) = 0;
  // compress::Codec's persistent_state / restore_state (the error-feedback residual), copied.
  virtual std::vector<float> persistent_state() = 0;
  virtual Status restore_state(std::span<const float> state) = 0;
};

// What a client trains. Injected, so tests can use a deterministic function.
class LocalTrainer {
 public:
  virtual ~LocalTrainer() = default;
  // The flat parameter layout; the global model and the delta follow it.
  virtual const compress::Layout& layout() const = 0;
  // Trains from `global` as `plan` asks and writes local - global into `delta`.
  virtual Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                                    std::span<float> delta) = 0;
  // Bytes train() allocates beyond what the trainer already holds (gradients, activations of
  // one batch, optimizer state), for the client's memory limit. 0: unknown.
  virtual uint64_t working_set_bytes(const v1::RoundPlan& plan) const {
    (void)plan;
    return 0;
  }
  // Whether a failed train() costs only that round (the client tells the aggregator, leaves the
  // round and comes back for the next) instead of stopping the client. True for trainers that
  // run the user's own code (ExecTrainer): its crash or hang must not end the device's service.
  virtual bool round_failures_recoverable() const { return false; }
  // An encoder of this trainer's updates with codec `spec` (seeded `seed`, as the client's host
  // codec would be), or nullptr (the default): the client encodes `delta` on the host. When the
  // client holds an encoder for a round's codec it calls train() with an empty `delta`, then
  // the encoder. Secure aggregation rounds always get a delta.
  virtual Result<std::unique_ptr<UpdateEncoder>> make_encoder(const std::string& spec,
                                                              uint64_t seed) {
    (void)spec;
    (void)seed;
    return std::unique_ptr<UpdateEncoder>();
  }
  // A leaf aggregator's "training" (aggregator/leaf.h): the clients the last train()'s mean
  // folds, with their weights (summing to its num_samples), sent with the upload and taken
  // from the trainer. Empty for a client.
  virtual std::vector<v1::Contribution> take_contributions() { return {}; }
};

struct EdgeClientOptions {
  net::ClientOptions connect;
  std::string node_id;  // must match our certificate's CN
  // What our Hello claims: CLIENT, or LEAF for a leaf aggregator's link to the tier above (its
  // certificate must then have role leaf).
  v1::Role role = v1::ROLE_CLIENT;
  net::BackoffOptions backoff;
  uint64_t seed = 1;  // codec randomness and backoff jitter
  uint32_t chunk_bytes = 1u << 20;
  // Device awareness. A round whose training would take the process over memory_limit_bytes
  // (0: no limit) is declined: the client disconnects and comes back after condition_poll.
  uint64_t memory_limit_bytes = 0;
  // Checked before connecting and on every round plan; while it refuses, the client stays
  // away (polling every condition_poll), so the aggregator plans without it.
  TrainingCondition condition;
  std::chrono::milliseconds condition_poll{30'000};
  uint64_t upload_bytes_per_second = 0;  // 0: no cap
  // A Heartbeat this often while connected and the io thread is free (0: none), so that a
  // client waiting for a round or for its upload turn is not taken for gone by the
  // aggregator's idle deadline (net::Deadlines::idle, 120 s by default).
  std::chrono::milliseconds heartbeat_interval{30'000};
  // Error-feedback residuals and round counters, saved atomically whenever the aggregator
  // acknowledges an update and restored on start (empty: kept in memory only).
  std::string state_path;
  // Take part only in rounds that run secure aggregation (the client's config has [secagg]
  // enabled): a round plan without it stops the client with an error, so its update never
  // leaves in the clear because of an aggregator's configuration.
  bool require_secure_aggregation = false;
  // Crash tests only: "uploading@R" SIGKILLs the process once half of round R's upload chunks
  // are on their way (`starling client` reads it from $STARLING_CRASH_POINT).
  std::string crash_point;
};

// Not thread-safe: everything runs on the io_context thread (training included, so one client
// per thread). The trainer must outlive the client. Destroying it aborts its connection.
class EdgeClient {
 public:
  EdgeClient(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx,
             EdgeClientOptions options, LocalTrainer& trainer);
  ~EdgeClient();
  EdgeClient(const EdgeClient&) = delete;
  EdgeClient& operator=(const EdgeClient&) = delete;

  // Connects (with retries) and loops until the aggregator ends the federation or stop().
  void start();
  void stop();
  // The aggregator said the federation is complete.
  bool finished() const;
  // Stopped for good: finished, stop(), or a fatal error (see error()).
  bool stopped() const;
  const Status& error() const;
  int rounds_trained() const;
  int connections() const;      // successful connections so far
  int rounds_declined() const;  // plans refused by the training condition or memory limit
  int rounds_lost() const;      // rounds a recoverable trainer failed
  int secagg_refusals() const;  // secure aggregation requests this client refused (see protocol.h)
  const Status& last_round_lost() const;  // why the latest of those failed
  uint64_t peak_rss_bytes() const;        // of the process, after the last round (0: unknown)
  // Where the time of the completed rounds went: from the round plan's arrival to the
  // aggregator's acknowledgement of the whole update, and the part spent in
  // LocalTrainer::train (the rest is download, decode, encode, waiting for the upload's turn and
  // the upload).
  struct RoundTimes {
    int rounds = 0;
    double total_seconds = 0.0;
    double train_seconds = 0.0;
  };
  RoundTimes round_times() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace starling::edge_client
