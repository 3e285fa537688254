// The aggregation server: registers clients over mutual TLS (identity from the certificate),
// runs rounds (selection with over-selection, model download, quorum, deadline), folds each
// update into a running weighted sum as it completes, steps the server optimizer and writes a
// crash-safe checkpoint after every round; a restart from the same state_dir resumes.
#pragma once

#include <array>
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

#include "aggregator/accumulator.h"
#include "aggregator/dp.h"
#include "aggregator/strategy.h"
#include "core/compress/codec.h"
#include "core/net/chunk_stream.h"
#include "core/net/server.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "core/wire/messages.pb.h"

namespace starling::aggregator {

class Monitor;

// Who may join, besides holding a client certificate of the federation CA: the names on the
// allow-list (when restricted), with a certificate serial the CRL does not list. The TLS layer
// refuses revoked certificates at the handshake (the CRL is in its trust store); the aggregator
// checks again at registration and closes open sessions when the policy changes.
struct AccessPolicy {
  bool restricted = false;        // false: every client certificate of the CA
  std::set<std::string> allowed;  // certificate CNs, when restricted
  std::set<std::string> revoked;  // certificate serials, upper-case hex
  // Empty when `node_id` (with certificate `serial`) may join, else why not.
  std::string refusal(const std::string& node_id, const std::string& serial) const;
};

struct AggregatorOptions {
  net::ServerOptions server;
  std::string node_id = "aggregator";  // must match our certificate's CN
  uint32_t num_rounds = 10;
  // Target updates per round: max(clients_per_round, ceil(fraction * available)), at least 1,
  // at most the clients available.
  uint32_t clients_per_round = 0;
  double fraction = 0.1;
  uint32_t min_available = 1;   // connected idle clients needed to start a round
  double over_selection = 0.0;  // select ceil(target * (1 + over_selection)) clients
  uint32_t min_updates = 1;     // at the deadline, fewer updates than this retry the round
  std::chrono::milliseconds round_deadline{60'000};
  uint64_t seed = 1;  // selection and the per-client seeds of round plans
  StrategyOptions strategy;
  AggregationRule rule;  // mean (streaming), median, trimmed mean, Krum; norm clipping
  // Central DP (see dp.h) when dp.enabled(): each available client is selected independently
  // with probability q = target / available (Poisson sampling; over_selection does not apply),
  // updates are clipped to dp.clip_norm (replacing rule.clip_norm) and weighted 1, and the mean
  // has a fixed denominator (q * available, the expected updates) and Gaussian noise. A DP
  // round waits for every selected client until the deadline and then closes with what came
  // (min_updates does not apply: retrying until enough arrive would change the sampling the
  // accountant assumes). REQUIRES: rule.rule == kMean and buffer_size == 0 (create() checks).
  DpOptions dp;
  AccessPolicy access;  // replaced while running by Aggregator::set_access
  // Fault injection for crash tests: "STAGE@ROUND" makes the process SIGKILL itself at that
  // stage of that (1-based) round: selecting (clients chosen, no plan sent), collecting (the
  // round's first upload chunk received), folding (an update folded, the round still open),
  // with secure aggregation secagg-keys (keys sent), secagg-masked (a masked vector added to
  // the sum), secagg-unmask (the unmask request sent, shares arriving),
  // stepped (the global model stepped, nothing written), writing (the global model file written,
  // the round state not), closed (the round state written, the round hook not run). Empty:
  // none. `starling aggregator` reads it from $STARLING_CRASH_POINT.
  std::string crash_point;
  // True in simulations (`starling aggregator --simulate`, `starling simulate`): only then may
  // dp.simulation_seed make the DP randomness reproducible.
  bool simulation = false;
  // Prometheus metrics and status page (monitor.h); null: none. Must run on the same io_context.
  std::shared_ptr<Monitor> monitor;
  // Secure aggregation (SecAgg+, docs/secagg.md) when secagg.enabled(). Each synchronous round
  // runs four stages with the clients selected: advertise keys, share keys (both before the
  // model goes out), masked input (the client's update, clipped, quantized and masked, uploaded
  // as chunks) and unmask. The aggregator holds one running sum of masked vectors and never an
  // update in the clear; the round's delta is the unmasked sum over the survivors divided by
  // their number (or, with secagg.noise_multiplier, by the expected number, q * available,
  // after Poisson sampling: distributed DP, accounted for as Skellam noise). A round whose
  // survivors fall below the threshold aborts, the model unchanged, and is retried.
  // REQUIRES: rule.rule == kMean without clip_norm, buffer_size == 0, no central dp.
  v1::FedSecAggConfig secagg;
  double secagg_randk_ratio = 0;  // local.codec "randk:ratio=R": the masked coordinates
  // How long the key stages and the unmask stage wait for the clients that have not answered;
  // the masked-input stage ends at the round deadline.
  std::chrono::milliseconds secagg_stage_timeout{10'000};
  // What the round plan asks of clients.
  uint32_t local_steps = 0;
  uint32_t batch_size = 10;
  float learning_rate = 0.1f;
  std::string codec = "identity";
  // FedBuff (Nguyen et al. 2022, Algorithm 1) when > 0: no synchronous rounds;
  // max(clients_per_round, ceil(fraction * registered)) clients train at all times, each update
  // is folded with weight 1 / sqrt(1 + staleness) (staleness: versions since its model was
  // sent), and every buffer_size = K updates make one server step with the staleness-weighted
  // sum over K (not over the weights: a buffer of stale updates moves the model less), through
  // the strategy (server_lr). A "round" in reports, checkpoints and num_rounds. Updates more
  // than max_staleness versions old are rejected.
  uint32_t buffer_size = 0;
  uint32_t max_staleness = 10;
  // Checkpoints after every round; empty: none (tests that do not test resumption).
  std::string state_dir;
  uint32_t chunk_bytes = 1u << 20;
  uint64_t max_update_bytes = 0;  // 0: 8 bytes per parameter + 1 MiB
  // Uploads in flight (compressed bytes, one per uploading client) are held in memory while
  // their total stays within this; the others go to unlinked files in spill_dir (empty:
  // <state_dir>/spill, or the system's temp dir without a state_dir). Each is folded, one at a
  // time, when its last chunk arrives, so the server's memory does not grow with the clients.
  uint64_t upload_memory_bytes = 256ull << 20;
  std::string spill_dir;
  // Model download bytes queued per connection at most (beyond the chunk being written).
  size_t download_window_bytes = 8u << 20;
  // Model downloads in progress at once: download_memory_bytes / download_window_bytes (at
  // least one); the other selected clients wait their turn, so fanning the model out to
  // thousands of clients holds a bounded amount of queued frames.
  uint64_t download_memory_bytes = 64ull << 20;
  // Uploads streaming at once. A client sends its chunks only once the aggregator grants its
  // upload (a ChunkAck from index 0); the others wait their turn in arrival order, so a round
  // where thousands of clients finish together holds this many chunk frames, not thousands.
  uint32_t upload_concurrency = 32;
  // Uploads of at least this many bytes check their SHA-256 on a helper thread each, off the
  // I/O thread that decrypts every connection's records, so that concurrent uploads hash on
  // several cores (smaller ones hash inline: a thread per tiny upload costs more than it saves).
  uint64_t background_hash_bytes = net::ChunkReceiver::kBackgroundHashMinBytes;
  // A granted upload that sends no chunk for this long is rejected and its turn goes to the
  // next one (a client that stalls or vanishes mid-upload cannot hold a turn for the
  // connection's idle timeout). Chunks sent before the grant reject the upload.
  std::chrono::milliseconds upload_stall_timeout{30'000};
  // A Heartbeat to every registered client this often (0: none), so that a client waiting for
  // a round, for its model download or for its upload turn does not take the quiet aggregator
  // for gone (net::Deadlines::idle, 120 s by default). Clients send theirs likewise
  // (EdgeClientOptions::heartbeat_interval).
  std::chrono::milliseconds heartbeat_interval{30'000};
  // A leaf of a tier (aggregator/leaf.h; `starling aggregator` with [upstream]): rounds start
  // only when the tier above asks (lead_round: its round number, model and plan; local_steps,
  // batch_size and learning_rate come from that plan, codec from these options), and close with
  // the rule's mean of the updates handed back to the caller instead of a step; nothing is
  // checkpointed (the tier above holds the model; a restarted leaf gets the next round's).
  // A round with fewer than min_updates updates when its window closes fails instead of being
  // retried. REQUIRES: no DP, no secure aggregation, buffer_size == 0 (create() checks).
  bool leaf = false;
};

// FedBuff's staleness discount s(tau) = 1 / sqrt(1 + tau) (Nguyen et al. 2022, Section 5).
float fedbuff_staleness_weight(uint64_t staleness);

// What happened in one completed round.
struct RoundReport {
  uint64_t round = 0;  // 1-based
  int selected = 0;
  int updates = 0;   // folded
  int rejected = 0;  // malformed, non-finite, checksum failures
  int lost = 0;      // clients that said their own training failed (exec trainer)
  int clipped = 0;   // scaled down to the clip norm
  int excluded = 0;  // Krum / Multi-Krum: folded but left out of the mean
  double total_weight = 0.0;
  double mean_train_loss = 0.0;  // weighted by examples
  uint64_t update_bytes = 0;     // compressed update bytes received and folded
  double seconds = 0.0;
  int registered = 0;              // clients registered when the round started
  double dp_epsilon = 0.0;         // privacy spent so far at dp.delta (0 without DP)
  double dp_noise_std = 0.0;       // per coordinate, this round
  double dp_sampling_rate = 0.0;   // q of this round's Poisson sampling
  double dp_expected_updates = 0;  // the fixed denominator, q * available
  double mean_staleness = 0.0;     // FedBuff: of the updates folded this round
  uint64_t max_staleness = 0;      // FedBuff
  int most_uploads_streaming = 0;  // uploads granted a turn at the same time, at most
  // Where the server's time went on the updates: seconds checking and folding them (on
  // rule.fold_threads threads), their bytes per second of that, and per second of the round.
  double fold_seconds = 0.0;
  double fold_gbps = 0.0;
  double receive_gbps = 0.0;
  // Secure aggregation (zeros without): clients whose masked vector is in the sum, clients
  // that shared their keys and sent none (their masks were removed), the graph's degree, the
  // threshold, and the framed bytes of each stage, both directions (advertise, share keys,
  // masked input, unmask).
  int secagg_survivors = 0;
  int secagg_dropped = 0;
  int secagg_degree = 0;
  int secagg_threshold = 0;
  std::array<uint64_t, 4> secagg_stage_bytes{};
};

// What a leaf's round hands to the tier above (Aggregator::lead_round).
struct LeafResult {
  RoundReport report;
  std::vector<float> mean;  // the rule's mean of the updates (weighted by examples for MEAN)
  double total_weight = 0;  // the examples behind it
  // Who contributed, with what weight: the leaf's clients, and the clients below a leaf of its
  // own (a deeper tree). Their weights sum to total_weight.
  std::vector<v1::Contribution> contributions;
};

// Not thread-safe: every call and handler runs on the io_context thread. Destroying it aborts
// every connection at once, as a crash would; the files already written stay.
class Aggregator {
 public:
  // Called after each round's checkpoint with the new global model. Returning false ends the
  // run after that round (e.g. a target accuracy was reached).
  using RoundHook = std::function<bool(const RoundReport&, std::span<const float> global)>;

  // Listens, and resumes from options.state_dir when it holds a round state (the initial model
  // is then replaced). REQUIRES: ctx made with TlsSide::kServer; `initial` has layout's numel.
  static Result<std::unique_ptr<Aggregator>> create(
      asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx, AggregatorOptions options,
      compress::Layout layout, std::vector<float> initial, RoundHook hook = {});
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  uint16_t port() const;
  uint64_t rounds_completed() const;
  // num_rounds completed (or the hook ended the run), or a fatal error (see error()).
  bool done() const;
  const Status& error() const;
  std::span<const float> global() const;
  size_t registered_clients() const;
  // Applies a new access policy at once: later registrations are checked against it, and the
  // open sessions of clients it refuses (off the allow-list, or revoked) are closed, each named
  // in the log and counted on the monitor.
  void set_access(AccessPolicy policy);
  // Updates folded so far in the round in progress (0 between rounds).
  int round_updates() const;

  // Leaves only (AggregatorOptions::leaf): runs round plan.round() of the tier above from
  // `model` with the clients connected, waiting for min_available of them and closing within
  // `window`, and calls `done` once with its result or why it failed (too few clients or
  // updates, the window closed, a bad model). A round still running is failed first.
  using LeafDone = std::function<void(Result<LeafResult>)>;
  void lead_round(const v1::RoundPlan& plan, std::vector<float> model,
                  std::chrono::milliseconds window, LeafDone done);
  // The tier above gave up on the round in progress (its caller stopped waiting): it ends and
  // `done` hears `why`.
  void abandon_round(const Status& why);
  // Ends the federation for the connected clients (they hear it is complete), as the last
  // round would: a leaf does when the tier above ends.
  void end_federation();

  struct Impl;

 private:
  explicit Aggregator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace starling::aggregator
