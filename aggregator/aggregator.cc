// Rounds, sessions and streaming aggregation of the aggregation server.
#include "aggregator/aggregator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <cmath>
#include <csignal>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "aggregator/accumulator.h"
#include "aggregator/monitor.h"
#include "aggregator/round_state.h"
#include "aggregator/upload_spill.h"
#include "core/net/chunk_stream.h"
#include "core/net/hello.h"
#include "core/secagg/encode.h"
#include "core/secagg/noise.h"
#include "core/secagg/protocol.h"
#include "core/util/rng.h"
#include "core/wire/chunk_frame.h"
#include "edge_client/transfer.h"

namespace starling::aggregator {

using Clock = std::chrono::steady_clock;

namespace {

uint64_t unix_ms_after(std::chrono::milliseconds d) {
  const auto t = std::chrono::system_clock::now() + d;
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count());
}

// FNV-1a: a per-client seed that does not depend on the standard library's std::hash.
uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The stages of a secure aggregation round, as the monitor and the logs name them.
constexpr const char* kSecAggStages[] = {"advertise", "share keys", "masked input", "unmask"};

// The bytes a message takes on the wire: the Envelope and its frame's length prefix.
uint64_t framed_size(const v1::Envelope& e) { return e.ByteSizeLong() + 4; }

v1::Envelope error_envelope(v1::ErrorCode code, std::string message, bool retryable) {
  v1::Envelope e;
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(std::move(message));
  e.mutable_error()->set_retryable(retryable);
  return e;
}

}  // namespace

std::string AccessPolicy::refusal(const std::string& node_id, const std::string& serial) const {
  if (revoked.count(serial)) return "certificate " + serial + " of " + node_id + " is revoked";
  if (restricted && !allowed.count(node_id)) return node_id + " is not on the allow-list";
  return "";
}

float fedbuff_staleness_weight(uint64_t staleness) {
  return static_cast<float>(1.0 / std::sqrt(1.0 + static_cast<double>(staleness)));
}

struct Aggregator::Impl : std::enable_shared_from_this<Impl> {
  struct Session {
    uint64_t id = 0;
    std::shared_ptr<net::Connection> conn;
    std::string node_id;
    bool registered = false;
    bool selected = false;
    bool submitted = false;
    // Where rx's bytes go: memory (reserved from the shared budget) or a spill file. Declared
    // before rx, so destroyed after it: rx's hashing thread may be reading the spill file.
    std::unique_ptr<MemoryReservation> reserved;
    std::unique_ptr<SpillFile> spill;
    std::optional<net::ChunkReceiver> rx;
    v1::UpdateUpload upload;
    uint64_t base_version = 0;  // of the model it was sent
    float weight = 0.0f;        // of its upload: examples; 1 under DP; FedBuff: 1/sqrt(1 + s)
    uint64_t staleness = 0;     // FedBuff: versions since its model was sent
    std::shared_ptr<edge_client::ChunkPump> pump;
    bool upload_granted = false;  // holds one of the upload turns
    // While granted: when the last chunk (or the grant) came, and the timer that takes the turn
    // back from an upload that stops sending (options.upload_stall_timeout).
    Clock::time_point last_progress;
    std::unique_ptr<asio::steady_timer> stall_timer;
    // Secure aggregation: this client's index in the round (-1: not in one).
    int64_t sa_index = -1;
    // A leaf aggregator of a tier below (Hello role LEAF): its upload is a partial mean with
    // the total weight and the contributions behind it.
    bool leaf = false;
  };

  // The secure aggregation of the round in progress (AggregatorOptions::secagg). What it holds
  // of the clients' updates is the ServerSession's running sum of masked vectors, nothing else:
  // each masked vector is read from its upload, added and dropped (docs/secagg.md).
  struct SecAggRound {
    explicit SecAggRound(asio::io_context& io_ctx) : timer(io_ctx) {}
    std::unique_ptr<secagg::ServerSession> server;
    std::vector<uint64_t> session_of;  // index -> session id
    secagg::Coordinates coords;
    v1::SecAggEncoding encoding;
    double client_variance = 0;      // distributed DP: each client's Skellam variance
    int stage = 0;                   // 0 advertise, 1 share keys, 2 masked input, 3 unmask
    std::vector<uint32_t> expected;  // who the stage waits for
    std::set<uint32_t> answered;     // of those, who answered (or was refused)
    asio::steady_timer timer;        // the stage timeout (stages 0, 1 and 3)
    std::array<uint64_t, 4> bytes{};
    int masked = 0;  // masked vectors added to the sum
  };

  Impl(asio::io_context& io_ctx, AggregatorOptions opts, compress::Layout lay,
       std::vector<float> initial, RoundHook h)
      : io(io_ctx),
        options(std::move(opts)),
        layout(std::move(lay)),
        global_bytes(take_f32_bytes(initial)),
        global(float_view(*global_bytes)),
        optimizer(options.strategy, static_cast<int64_t>(global.size())),
        accumulator(static_cast<int64_t>(global.size()), options.rule),
        hook(std::move(h)),
        deadline_timer(io_ctx),
        heartbeat_timer(io_ctx),
        leaf_timer(io_ctx) {
    if (options.dp.enabled()) accountant.emplace();
    if (secagg_dp()) skellam.emplace();
  }

  asio::io_context& io;
  AggregatorOptions options;
  compress::Layout layout;
  // The global model: its f32 bytes, which every download sends from this one buffer (shared
  // with the downloads in flight), and a float view of them. A step writes a copy only while a
  // download of the old model still holds the buffer (own_global()), so the server keeps one
  // model, not a model and its payload.
  std::shared_ptr<std::string> global_bytes;
  std::span<float> global;
  ServerOptimizer optimizer;
  UpdateAccumulator accumulator;
  RoundHook hook;
  std::optional<RdpAccountant> accountant;   // central DP only
  std::optional<SkellamAccountant> skellam;  // distributed DP (secure aggregation) only
  std::unique_ptr<SecAggRound> sa;           // the secure round in progress
  // Central DP: this round's randomness (Poisson sampling, then the noise), its sampling rate
  // and fixed denominator.
  std::optional<NoiseSource> dp_source;
  double dp_q = 0.0;
  double dp_expected = 0.0;
  std::unique_ptr<net::Server> server;
  asio::steady_timer deadline_timer;
  asio::steady_timer heartbeat_timer;
  // Leaf mode: the round the tier above asked for, its caller, and when its window closes.
  asio::steady_timer leaf_timer;
  std::optional<v1::RoundPlan> leaf_plan;
  LeafDone leaf_done;
  Clock::time_point leaf_until;
  uint64_t leaf_requests = 0;
  // Who the updates folded this round came from, with their weights (a leaf's upload lists its
  // own contributors): what a leaf reports upward, and what keeps one client from counting
  // twice through two leaves.
  std::vector<v1::Contribution> contributions;
  std::set<std::string> contributors;

  uint64_t upload_memory_used = 0;  // declared before sessions: their reservations point here
  // Turns for model downloads; declared before sessions, whose pumps give slots back.
  std::shared_ptr<edge_client::PumpSlots> download_slots = std::make_shared<edge_client::PumpSlots>(
      static_cast<size_t>(options.download_memory_bytes / options.download_window_bytes));
  std::map<uint64_t, Session> sessions;
  uint64_t next_session = 1;
  std::deque<uint64_t> upload_queue;  // sessions whose upload waits for a turn
  uint32_t uploads_streaming = 0;
  uint32_t most_streaming = 0;  // this round
  uint64_t round = 0;           // completed
  uint64_t version = 0;
  uint64_t attempt = 0;  // retries of the round in progress
  uint64_t next_transfer = 1;
  bool round_active = false;
  bool start_posted = false;
  bool done = false;
  Status error;
  // The round in progress.
  int target = 0;
  int selected = 0;
  int rejected = 0;
  int lost = 0;  // clients that said their training lost this round
  int registered_at_start = 0;
  double loss_sum = 0.0;
  uint64_t bytes_in = 0;
  double fold_seconds = 0.0;   // this round
  double staleness_sum = 0.0;  // FedBuff, this round
  uint64_t staleness_max = 0;
  Clock::time_point started;
  uint64_t dispatches = 0;

  bool async() const { return options.buffer_size > 0; }
  bool secure() const { return options.secagg.enabled(); }
  bool secagg_dp() const { return secure() && options.secagg.noise_multiplier() > 0; }
  // Rounds draw their clients by Poisson sampling (the DP accountants assume it).
  bool poisson() const { return accountant.has_value() || skellam.has_value(); }

  // options.crash_point: a real SIGKILL of this process, at the named stage of a round.
  // `in_round`: the round the stage belongs to (default: the one in progress).
  void crash_point(std::string_view stage, uint64_t in_round = 0) const {
    if (options.crash_point.empty()) return;
    if (in_round == 0) in_round = round + 1;
    if (options.crash_point == std::string(stage) + "@" + std::to_string(in_round)) {
      spdlog::warn("aggregator: crash point {}: SIGKILL", options.crash_point);
      spdlog::default_logger()->flush();
      std::raise(SIGKILL);
    }
  }

  Status resume() {
    if (options.state_dir.empty()) return ok_status();
    auto st = load_round_state(options.state_dir, layout);
    if (st.status().code() == StatusCode::kNotFound) return ok_status();
    if (!st.ok()) return st.status().with_context("resuming from " + options.state_dir);
    if (st->strategy != strategy_name(options.strategy.kind)) {
      return failed_precondition("state in " + options.state_dir + " was written by strategy " +
                                 st->strategy + ", this run uses " +
                                 std::string(strategy_name(options.strategy.kind)));
    }
    for (auto& [name, slot] : optimizer.slots()) {
      auto it = std::find_if(st->slots.begin(), st->slots.end(),
                             [&](const auto& s) { return s.first == name; });
      if (it == st->slots.end()) return data_loss("round state lacks server_opt." + name);
      *slot = std::move(it->second);
    }
    if (accountant || skellam) {
      // A state written without DP (or with another order set) cannot say what was spent.
      RdpAccountant& a = accountant ? *accountant : *skellam;
      RETURN_IF_ERROR(a.restore(std::move(st->dp_rdp)),
                      "resuming the DP accountant from " + options.state_dir);
    }
    global_bytes.reset();  // the initial model goes before the saved one is copied in
    global_bytes = take_f32_bytes(st->global);
    global = float_view(*global_bytes);
    round = st->round;
    version = st->model_version;
    spdlog::info("aggregator: resumed from {} after round {}", options.state_dir, round);
    if (round >= options.num_rounds) done = true;
    return ok_status();
  }

  void accept(std::shared_ptr<net::Connection> conn) {
    const uint64_t id = next_session++;
    sessions[id].id = id;
    sessions[id].conn = conn;
    auto weak = weak_from_this();
    // Chunks arrive as views into the receive buffer: no protobuf copy of their data.
    conn->set_chunk_handler([weak, id](const wire::ChunkView& c) {
      auto self = weak.lock();
      if (!self) return;
      const auto it = self->sessions.find(id);
      if (it == self->sessions.end()) return;
      if (!it->second.registered) {
        return self->reject_peer(it->second, v1::ERROR_CODE_BAD_REQUEST,
                                 failed_precondition("expected Hello"));
      }
      self->on_chunk(it->second, c);
    });
    conn->start(
        [weak, id](v1::Envelope e) {
          if (auto self = weak.lock()) self->on_message(id, std::move(e));
        },
        [weak, id](const Status& st) {
          if (auto self = weak.lock()) self->on_close(id, st);
        });
    if (done) finish_session(sessions[id]);
  }

  void on_close(uint64_t id, const Status& st) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    if (it->second.registered) {
      spdlog::info("aggregator: {} {} left ({})", it->second.leaf ? "leaf" : "client",
                   it->second.node_id, st.to_string());
    }
    const bool was_outstanding = it->second.selected && !it->second.submitted;
    const bool was_registered = it->second.registered;
    reset_upload(it->second);  // gives back its upload turn
    sessions.erase(it);
    if (options.monitor && was_registered) options.monitor->set_registered(registered_count());
    if (async()) {
      post_start();
    } else if (round_active && (sa || was_outstanding)) {
      check_round_end();
    }
  }

  void send(Session& s, const v1::Envelope& e) {
    const Status st = s.conn->send(e);
    if (!st.ok()) spdlog::warn("aggregator: send to {}: {}", s.node_id, st.to_string());
  }

  void reject_peer(Session& s, v1::ErrorCode code, const Status& why) {
    spdlog::warn("aggregator: {}: {}", s.conn->peer().describe(), why.to_string());
    send(s, error_envelope(code, why.message(), false));
    s.conn->close();
  }

  void on_message(uint64_t id, v1::Envelope e) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    Session& s = it->second;
    if (!s.registered) {
      if (!e.has_hello()) {
        return reject_peer(s, v1::ERROR_CODE_BAD_REQUEST, failed_precondition("expected Hello"));
      }
      return on_hello(id, s, e.hello());
    }
    switch (e.body_case()) {
      case v1::Envelope::kUpdateUpload:
        return on_upload(s, e.update_upload());
      case v1::Envelope::kChunk:  // normally taken by the chunk handler
        return on_chunk(s, wire::view_of(e.chunk()));
      case v1::Envelope::kChunkAck:
        if (s.pump && e.chunk_ack().transfer_id() == s.pump->header().transfer_id() &&
            !e.chunk_ack().complete()) {
          s.pump->resume_from(e.chunk_ack().next_index());
        }
        return;
      case v1::Envelope::kSecagg:
        return on_secagg(s, e);
      case v1::Envelope::kHeartbeat:
      case v1::Envelope::kAck:
        return;
      case v1::Envelope::kError:
        spdlog::warn("aggregator: error from {}: {}", s.node_id, e.error().message());
        // A client that lost a round to its own training says so before it goes (its
        // connection closes next, which drops it from the round).
        if (e.error().code() == v1::ERROR_CODE_INTERNAL && e.error().retryable()) {
          ++lost;
          if (options.monitor) options.monitor->client_round_failed(s.node_id, e.error().message());
        }
        return;
      default:
        send(s,
             error_envelope(v1::ERROR_CODE_BAD_REQUEST, "unexpected message from a client", false));
    }
  }

  void on_hello(uint64_t id, Session& s, const v1::Hello& hello) {
    const Status st = net::check_hello(hello, s.conn->peer());
    if (!st.ok()) return reject_peer(s, v1::ERROR_CODE_PERMISSION_DENIED, st);
    if (hello.role() != v1::ROLE_CLIENT && hello.role() != v1::ROLE_LEAF) {
      return reject_peer(s, v1::ERROR_CODE_PERMISSION_DENIED,
                         permission_denied("only clients and leaf aggregators may join a "
                                           "federation"));
    }
    if (hello.role() == v1::ROLE_LEAF) {
      if (const std::string why = leaf_refusal(); !why.empty()) {
        return reject_peer(s, v1::ERROR_CODE_PERMISSION_DENIED,
                           failed_precondition("leaf " + hello.node_id() + " refused: " + why));
      }
    }
    const std::string refused =
        options.access.refusal(s.conn->peer().node_id, s.conn->peer().serial);
    if (!refused.empty()) {
      if (options.monitor) options.monitor->identity_refused(s.conn->peer().node_id, refused);
      return reject_peer(s, v1::ERROR_CODE_PERMISSION_DENIED, permission_denied(refused));
    }
    // A reconnecting client replaces its old connection.
    for (auto& [other_id, other] : sessions) {
      if (other_id != id && other.registered && other.node_id == hello.node_id()) {
        other.conn->abort(unavailable("replaced by a new connection"));
        break;
      }
    }
    s.node_id = hello.node_id();
    s.registered = true;
    s.leaf = hello.role() == v1::ROLE_LEAF;
    v1::Envelope reply;
    *reply.mutable_hello() = net::make_hello(options.node_id, v1::ROLE_AGGREGATOR, {options.codec},
                                             wire::kDefaultMaxFrameBytes);
    send(s, reply);
    spdlog::info("aggregator: {} {} registered ({} connected)", s.leaf ? "leaf" : "client",
                 s.node_id, registered_count());
    if (options.monitor) options.monitor->set_registered(registered_count());
    post_start();
  }

  // Why this aggregator cannot take leaves ("" when it can): rules whose result over the
  // leaves' means is not their result over the clients' updates, and privacy mechanisms built
  // for one tier (docs/federation.md, "Aggregator tiers").
  std::string leaf_refusal() const {
    if (options.dp.enabled()) {
      return "this aggregator runs central DP, which is not built across tiers (the accountant "
             "needs one Poisson sample over all clients and one noise draw)";
    }
    if (secure()) {
      return "this aggregator runs secure aggregation, which is not built across tiers (a leaf "
             "would upload its clients' sum in the clear)";
    }
    if (options.rule.rule != RobustRule::kMean || options.rule.clip_norm > 0) {
      return "this aggregator's robust rule (median, trimmed mean, Krum or norm clipping) does "
             "not compose across tiers: its result over the leaves' means is not its result "
             "over the clients' updates. Run the rule at the leaves ([robust] in each leaf's "
             "config) and MEAN without clip_norm at the root";
    }
    return "";
  }

  size_t registered_count() const {
    return static_cast<size_t>(std::count_if(sessions.begin(), sessions.end(),
                                             [](const auto& p) { return p.second.registered; }));
  }

  void post_start() {
    if (start_posted || done || (round_active && !async())) return;
    start_posted = true;
    asio::post(io, [weak = weak_from_this()] {
      if (auto self = weak.lock()) {
        self->start_posted = false;
        self->maybe_start_round();
      }
    });
  }

  // `values` as f32 bytes; frees `values` at once, so that the model is not held twice while
  // the rest of the server is built.
  static std::shared_ptr<std::string> take_f32_bytes(std::vector<float>& values) {
    auto bytes = std::make_shared<std::string>(edge_client::to_f32_bytes(values));
    std::vector<float>().swap(values);  // (= {} would keep the capacity)
    return bytes;
  }
  static std::span<float> float_view(std::string& bytes) {
    return {reinterpret_cast<float*>(bytes.data()), bytes.size() / sizeof(float)};
  }
  void set_global(std::span<const float> values) {
    global_bytes = std::make_shared<std::string>(edge_client::to_f32_bytes(values));
    global = float_view(*global_bytes);
  }
  // Before the model changes: downloads still sending it keep the old buffer (finished ones
  // let go of it first; their chunks were copied into frames).
  void own_global() {
    for (auto& [sid, s] : sessions) {
      if (s.pump && s.pump->done()) s.pump.reset();
    }
    if (global_bytes.use_count() > 1) set_global(global);
  }
  // The model payload of the current version, shared by every dispatch.
  std::shared_ptr<const std::string> model_payload() const { return global_bytes; }

  void dispatch(Session& s) {
    send_plan(s);
    if (!secure()) send_model(s);  // secure rounds send it once the key stages closed
  }

  void send_plan(Session& s) {
    s.selected = true;
    // The client trains on its I/O thread, silent (no heartbeats) until it uploads: its
    // connection may stay quiet until the round's deadline, and a minute more.
    s.conn->set_idle_deadline(std::max(options.server.connection.deadlines.idle,
                                       options.round_deadline + std::chrono::minutes(1)));
    s.submitted = false;
    reset_upload(s);
    s.base_version = version;
    v1::Envelope plan;
    auto* p = plan.mutable_round_plan();
    p->set_round(round + 1);
    p->set_model_version(version);
    // A leaf relays the tier above's plan; its clients upload with its own codec.
    p->set_local_steps(leaf_plan ? leaf_plan->local_steps() : options.local_steps);
    p->set_batch_size(leaf_plan ? leaf_plan->batch_size() : options.batch_size);
    p->set_learning_rate(leaf_plan ? leaf_plan->learning_rate() : options.learning_rate);
    p->set_codec(options.codec);
    p->set_deadline_unix_ms(unix_ms_after(round_deadline()));
    p->set_seed(Rng(options.seed).fork(round + 1).fork(fnv1a(s.node_id)).next_u64());
    p->set_secure_aggregation(secure());
    send(s, plan);
  }

  void send_model(Session& s) {
    if (s.pump) s.pump->cancel();
    s.pump = std::make_shared<edge_client::ChunkPump>(
        s.conn, model_payload(), next_transfer++, options.chunk_bytes,
        std::string(edge_client::kModelContentType), options.download_window_bytes);
    v1::Envelope dl;
    auto* d = dl.mutable_model_download();
    d->set_round(round + 1);
    d->set_model_version(version);
    *d->mutable_transfer() = s.pump->header();
    send(s, dl);
    s.pump->set_slots(download_slots);
    s.pump->start();
  }

  // FedBuff: keep `concurrency` clients training on the latest model at all times.
  void dispatch_async() {
    std::vector<Session*> idle;
    size_t registered = 0;
    size_t in_flight = 0;
    for (auto& [sid, s] : sessions) {
      if (!s.registered || !s.conn->is_open()) continue;
      ++registered;
      if (s.selected) {
        ++in_flight;
      } else {
        idle.push_back(&s);
      }
    }
    if (!round_active) {
      if (registered == 0 || registered < options.min_available) return;
      round_active = true;
      target = static_cast<int>(options.buffer_size);
      started = Clock::now();
      if (options.monitor) options.monitor->round_started(round + 1, 0);
    }
    const size_t concurrency = std::max<size_t>(
        1, std::max<size_t>(options.clients_per_round,
                            static_cast<size_t>(std::ceil(
                                options.fraction * static_cast<double>(registered) - 1e-6))));
    std::sort(idle.begin(), idle.end(),
              [](const Session* a, const Session* b) { return a->node_id < b->node_id; });
    Rng rng = Rng(options.seed).fork(++dispatches);
    for (size_t i = 0; i < idle.size() && in_flight < concurrency; ++i, ++in_flight) {
      const size_t j = i + static_cast<size_t>(rng.below(idle.size() - i));
      std::swap(idle[i], idle[j]);
      dispatch(*idle[i]);
      ++selected;
    }
  }

  // How long the round starting now may take: a leaf's ends within the window of the tier
  // above's round.
  std::chrono::milliseconds round_deadline() const {
    if (!options.leaf) return options.round_deadline;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(leaf_until - Clock::now());
    return std::clamp(left, std::chrono::milliseconds(1), options.round_deadline);
  }

  void maybe_start_round() {
    if (done) return;
    if (async()) return dispatch_async();
    if (round_active) return;
    if (options.leaf && !leaf_done) return;  // a leaf's rounds are the tier above's
    std::vector<Session*> idle;
    for (auto& [sid, s] : sessions) {
      if (s.registered && s.conn->is_open()) idle.push_back(&s);
    }
    const size_t available = idle.size();
    if (available == 0 || available < options.min_available) return;
    std::sort(idle.begin(), idle.end(),
              [](const Session* a, const Session* b) { return a->node_id < b->node_id; });
    // The slack keeps fractions read from float configs (0.1f * 100 = 10.0000001) from
    // rounding up to one client more.
    auto ceil_count = [](double x) { return static_cast<size_t>(std::ceil(x - 1e-6)); };
    size_t want = std::max<size_t>(options.clients_per_round,
                                   ceil_count(options.fraction * static_cast<double>(available)));
    want = std::clamp<size_t>(want, 1, available);
    size_t pick =
        std::min(available, ceil_count(static_cast<double>(want) * (1.0 + options.over_selection)));
    if (poisson()) {
      // Poisson sampling with the accountant's q over the clients that could be sampled, from
      // the DRBG (a seeded stream only in simulations that ask for it).
      dp_source =
          options.dp.simulation_seed
              ? NoiseSource::seeded(
                    Rng(options.dp.simulation_seed).fork(((round + 1) << 16) + attempt).next_u64())
              : NoiseSource::secure();
      dp_q = std::min(1.0, static_cast<double>(want) / static_cast<double>(available));
      dp_expected = dp_q * static_cast<double>(available);
      auto drawn = poisson_sample(available, dp_q, *dp_source);
      if (!drawn.ok()) {
        error = drawn.status().with_context("DP sampling of round " + std::to_string(round + 1));
        spdlog::error("aggregator: {}", error.to_string());
        return finish();
      }
      for (size_t i = 0; i < drawn->size(); ++i) std::swap(idle[i], idle[(*drawn)[i]]);
      pick = drawn->size();
    } else {
      Rng rng = Rng(options.seed).fork(((round + 1) << 16) + attempt);
      for (size_t i = 0; i < pick; ++i) {
        const size_t j = i + static_cast<size_t>(rng.below(available - i));
        std::swap(idle[i], idle[j]);
      }
    }
    crash_point("selecting");
    // Under DP the round waits for every client drawn (their number is random).
    target = static_cast<int>(poisson() ? pick : want);
    selected = static_cast<int>(pick);
    registered_at_start = static_cast<int>(registered_count());
    rejected = 0;
    lost = 0;
    loss_sum = 0.0;
    bytes_in = 0;
    fold_seconds = 0.0;
    most_streaming = uploads_streaming;
    accumulator.reset();
    contributions.clear();
    contributors.clear();
    round_active = true;
    started = Clock::now();

    if (secure()) {
      const Status planned = start_secagg(std::span<Session* const>(idle.data(), pick));
      if (!planned.ok()) return secagg_unplanned(planned);
    } else {
      for (size_t i = 0; i < pick; ++i) dispatch(*idle[i]);
    }
    if (options.monitor) options.monitor->round_started(round + 1, static_cast<int>(pick));
    if (sa && options.monitor) options.monitor->secagg_stage(round + 1, 0, static_cast<int>(pick));
    if (poisson()) {
      spdlog::info(
          "aggregator: round {} started: {} drawn by Poisson sampling at q = {:.4g} ({} "
          "available, {:.4g} expected)",
          round + 1, pick, dp_q, available, dp_expected);
      if (pick == 0 && accountant) {  // nobody drawn: the round releases noise alone, accounted
        return close_round();
      }
    } else {
      spdlog::info("aggregator: round {} started: {} selected for {} updates ({} available)",
                   round + 1, pick, want, available);
    }
    deadline_timer.expires_after(round_deadline());
    deadline_timer.async_wait(
        [weak = weak_from_this(), r = round, a = attempt](const asio::error_code& ec) {
          auto self = weak.lock();
          if (ec || !self || !self->round_active || self->round != r || self->attempt != a) return;
          if (self->sa) return self->secagg_deadline();
          spdlog::warn("aggregator: round {} deadline passed with {} of {} updates", r + 1,
                       self->accumulator.count(), self->target);
          self->end_partial_round();
        });
  }

  // ---- Secure aggregation (AggregatorOptions::secagg; docs/secagg.md) ----

  // Plans the round's SecAgg+ over the clients chosen (in selection order: client i of the
  // round is chosen[i]) and sends each its plan and setup; the model follows the key stages.
  Status start_secagg(std::span<Session* const> chosen) {
    const auto n = static_cast<uint32_t>(chosen.size());
    const auto& cfg = options.secagg;
    auto next = std::make_unique<SecAggRound>(io);
    const uint64_t coordinates_seed =
        Rng(options.seed).fork(7).fork(((round + 1) << 16) + attempt).next_u64();
    next->coords =
        secagg::choose_coordinates(options.secagg_randk_ratio, global.size(), coordinates_seed);
    ASSIGN_OR_RETURN(
        auto params,
        secagg::plan_round(n, cfg.threshold(), cfg.degree(), cfg.modulus_bits(),
                           next->coords.length(global.size()), cfg.dropout_tolerance()),
        "secure aggregation of " + std::to_string(n) + " clients");
    next->client_variance = secagg::client_noise_variance(cfg, params);
    next->encoding = secagg::encoding_of(cfg, options.secagg_randk_ratio, coordinates_seed,
                                         next->client_variance);
    std::vector<std::string> names;
    for (Session* s : chosen) {
      names.push_back(s->node_id);
      next->session_of.push_back(s->id);
    }
    ASSIGN_OR_RETURN(next->server, secagg::ServerSession::create(round + 1, params, names));
    sa = std::move(next);
    for (uint32_t i = 0; i < n; ++i) {
      Session& s = *chosen[i];
      send_plan(s);
      s.sa_index = i;
      v1::Envelope e;
      *e.mutable_secagg()->mutable_setup() = sa->server->setup(i);
      *e.mutable_secagg()->mutable_setup()->mutable_encoding() = sa->encoding;
      send_secagg(s, 0, e);
    }
    spdlog::info(
        "aggregator: round {}: secure aggregation of {} clients: degree {}, threshold {}, {} "
        "integers of {} bits each",
        round + 1, n, params.degree, params.threshold, params.vector_length, params.modulus_bits);
    begin_secagg_stage(0, all_indices(n));
    return ok_status();
  }

  static std::vector<uint32_t> all_indices(uint32_t n) {
    std::vector<uint32_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = i;
    return v;
  }

  // A round the threshold cannot be planned for: under distributed DP (Poisson sampling may
  // draw too few) it is drawn again after a pause; otherwise the config cannot run, and the
  // federation stops with the reason.
  void secagg_unplanned(const Status& why) {
    round_active = false;
    for (auto& [sid, s] : sessions) {
      s.selected = false;
      s.sa_index = -1;
    }
    if (!secagg_dp()) {
      error = why.with_context("round " + std::to_string(round + 1));
      spdlog::error("aggregator: {}", error.to_string());
      return finish();
    }
    spdlog::warn(
        "aggregator: round {}: {} drawn, too few for secure aggregation ({}); drawing again",
        round + 1, selected, why.message());
    ++attempt;
    deadline_timer.expires_after(
        std::min<std::chrono::milliseconds>(options.round_deadline, std::chrono::seconds(1)));
    deadline_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
      if (auto self = weak.lock(); self && !ec) self->post_start();
    });
  }

  void send_secagg(Session& s, int stage, const v1::Envelope& e) {
    sa->bytes[static_cast<size_t>(stage)] += framed_size(e);
    send(s, e);
  }

  Session* sa_session(uint32_t index) {
    const auto it = sessions.find(sa->session_of[index]);
    if (it == sessions.end() || !it->second.conn->is_open()) return nullptr;
    return &it->second;
  }

  // Starts stage `stage`, waiting for `expected`; stages 0, 1 and 3 close at the stage timeout
  // at the latest, stage 2 at the round deadline.
  void begin_secagg_stage(int stage, std::vector<uint32_t> expected) {
    sa->stage = stage;
    sa->expected = std::move(expected);
    sa->answered.clear();
    sa->timer.cancel();
    if (options.monitor && stage > 0) {  // stage 0 is reported with the round's start
      options.monitor->secagg_stage(round + 1, stage, static_cast<int>(sa->expected.size()));
    }
    if (stage == 2) return;
    sa->timer.expires_after(options.secagg_stage_timeout);
    sa->timer.async_wait([weak = weak_from_this(), r = round, a = attempt,
                          stage](const asio::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || !self->sa || self->round != r || self->attempt != a ||
          self->sa->stage != stage) {
        return;
      }
      spdlog::warn("aggregator: round {}: secure aggregation stage '{}' timed out with {} of {}",
                   r + 1, kSecAggStages[stage], self->sa->answered.size(),
                   self->sa->expected.size());
      self->close_secagg_stage();
    });
  }

  // Closes the stage once every client it waits for answered, was refused or is gone.
  void maybe_close_secagg_stage() {
    for (uint32_t i : sa->expected) {
      if (!sa->answered.count(i) && sa_session(i) != nullptr) return;
    }
    close_secagg_stage();
  }

  void secagg_deadline() {
    if (sa->stage == 3) return;  // the unmask stage has its own timeout
    if (sa->stage == 2) {
      spdlog::warn("aggregator: round {} deadline passed with {} of {} masked vectors", round + 1,
                   sa->masked, sa->expected.size());
      return close_secagg_stage();
    }
    abort_secagg_round(deadline_exceeded("the key stages did not finish before the deadline"));
  }

  void close_secagg_stage() {
    switch (sa->stage) {
      case 0: {
        if (Status st = sa->server->close_advertise(); !st.ok()) return abort_secagg_round(st);
        const auto advertised = sa->server->advertised();
        for (uint32_t i : advertised) {
          if (Session* s = sa_session(i)) {
            v1::Envelope e;
            *e.mutable_secagg()->mutable_keys() = sa->server->keys_for(i);
            send_secagg(*s, 1, e);
          }
        }
        crash_point("secagg-keys");
        return begin_secagg_stage(1, advertised);
      }
      case 1: {
        if (Status st = sa->server->close_share_keys(); !st.ok()) return abort_secagg_round(st);
        const auto shared = sa->server->shared();
        const std::set<uint32_t> in(shared.begin(), shared.end());
        for (uint32_t i = 0; i < sa->session_of.size(); ++i) {
          Session* s = sa_session(i);
          if (s == nullptr) continue;
          if (!in.count(i)) {  // out of the round: it never gets the model
            s->selected = false;
            s->sa_index = -1;
            continue;
          }
          v1::Envelope e;
          *e.mutable_secagg()->mutable_ciphertexts() = sa->server->ciphertexts_for(i);
          send_secagg(*s, 2, e);
          send_model(*s);
        }
        begin_secagg_stage(2, shared);
        return maybe_close_secagg_stage();
      }
      case 2: {
        auto request = sa->server->close_masked_input();
        if (!request.ok()) return abort_secagg_round(request.status());
        // Uploads still streaming are too late: their senders count as dropped.
        upload_queue.clear();
        for (auto& [sid, s] : sessions) {
          if (s.rx) reset_upload(s);
        }
        v1::Envelope e;
        *e.mutable_secagg()->mutable_unmask_request() = *request;
        const auto survivors = sa->server->survivors();
        for (uint32_t i : survivors) {
          if (Session* s = sa_session(i)) send_secagg(*s, 3, e);
        }
        spdlog::info("aggregator: round {}: {} masked vectors summed, {} dropped; unmasking",
                     round + 1, survivors.size(), request->dropped_size());
        crash_point("secagg-unmask");
        begin_secagg_stage(3, survivors);
        return maybe_close_secagg_stage();
      }
      default:
        return finish_secagg();
    }
  }

  // Aborts the round: nothing was unmasked and the model is unchanged; the round is retried
  // with a fresh session (new keys, new masks) for whoever is connected.
  void abort_secagg_round(const Status& why) {
    spdlog::warn(
        "aggregator: round {} aborted in secure aggregation stage '{}': {}; the model is "
        "unchanged; retrying with fresh keys",
        round + 1, kSecAggStages[sa->stage], why.message());
    sa->timer.cancel();
    sa.reset();
    if (options.monitor) options.monitor->secagg_stage(round + 1, -1, 0);
    round_active = false;
    ++attempt;
    deadline_timer.cancel();
    upload_queue.clear();
    for (auto& [sid, s] : sessions) {
      s.selected = false;
      s.sa_index = -1;
      reset_upload(s);
    }
    post_start();
  }

  void on_secagg(Session& s, const v1::Envelope& e) {
    const v1::SecAggMessage& m = e.secagg();
    if (!sa || !round_active || s.sa_index < 0) {
      // A late answer to an aborted or closed round (its session id no longer exists).
      spdlog::debug("aggregator: secure aggregation message from {} outside its round", s.node_id);
      return;
    }
    const auto index = static_cast<uint32_t>(s.sa_index);
    int stage = -1;
    uint32_t claimed = 0;
    switch (m.stage_case()) {
      case v1::SecAggMessage::kAdvertise:
        stage = 0;
        claimed = m.advertise().index();
        break;
      case v1::SecAggMessage::kShareKeys:
        stage = 1;
        claimed = m.share_keys().index();
        break;
      case v1::SecAggMessage::kUnmaskShares:
        stage = 3;
        claimed = m.unmask_shares().index();
        break;
      default:
        break;
    }
    Status st;
    if (stage < 0) {
      st = invalid_argument("client " + s.node_id +
                            " sent a secure aggregation message clients do not send");
    } else if (stage != sa->stage) {
      st = failed_precondition("client " + s.node_id + " sent its '" + kSecAggStages[stage] +
                               "' message in stage '" + kSecAggStages[sa->stage] + "'");
    } else if (claimed != index) {
      st = permission_denied("client " + s.node_id + " is client " + std::to_string(index) +
                             " of the round, its message claims to be client " +
                             std::to_string(claimed));
    } else {
      sa->bytes[static_cast<size_t>(stage)] += framed_size(e);
      if (stage == 0) st = sa->server->receive_advertise(m.advertise());
      if (stage == 1) st = sa->server->receive_share_keys(m.share_keys());
      if (stage == 3) st = sa->server->receive_unmask_shares(m.unmask_shares());
    }
    if (!st.ok()) {
      ++rejected;
      if (options.monitor) options.monitor->update_rejected();
      spdlog::warn("aggregator: round {}: secure aggregation: refused: {}", round + 1,
                   st.to_string());
      send(s, error_envelope(v1::ERROR_CODE_BAD_REQUEST, st.message(), false));
    }
    if (stage == sa->stage) {
      sa->answered.insert(index);
      maybe_close_secagg_stage();
    }
  }

  // A complete upload of a secure round: a masked vector, added to the running sum and
  // dropped. Returns false when it was refused (reject_update has run).
  bool fold_masked(Session& s, std::string payload) {
    v1::SecAggMaskedInput m;
    Status st;
    if (s.upload.transfer().content_type() != edge_client::kSecAggMaskedContentType) {
      st = invalid_argument("a secure aggregation round takes masked vectors ('" +
                            std::string(edge_client::kSecAggMaskedContentType) + "'), not '" +
                            s.upload.transfer().content_type() + "'");
    } else if (!m.ParseFromString(payload)) {
      st = data_loss("malformed masked vector");
    } else if (m.index() != static_cast<uint64_t>(s.sa_index)) {
      st = permission_denied("client " + s.node_id + " is client " + std::to_string(s.sa_index) +
                             " of the round, its masked vector claims to be client " +
                             std::to_string(m.index()));
    } else {
      st = sa->server->receive_masked_input(m);
    }
    sa->answered.insert(static_cast<uint32_t>(s.sa_index));
    sa->bytes[2] += s.upload.transfer().total_bytes();
    if (!st.ok()) {
      reject_update(s, st);
      return false;
    }
    if (sa->masked++ == 0) crash_point("secagg-masked");
    return true;
  }

  // Unmasks the sum, and steps the model with the survivors' mean (distributed DP: the sum
  // over the expected number of clients, and the accountant charges the round).
  void finish_secagg() {
    auto sum = sa->server->finish();
    if (!sum.ok()) return abort_secagg_round(sum.status());
    const secagg::Quantizer q = secagg::quantizer_of(options.secagg);
    std::vector<float> summed(sum->size());
    q.dequantize_sum(*sum, summed);
    // The step goes where a plain round's sum would be (the accumulator is idle in a secure
    // round), so that no second model-sized vector is kept.
    const std::span<float> delta = accumulator.mutable_sum();
    secagg::scatter(sa->coords, summed, delta);
    const auto survivors = static_cast<double>(sa->server->survivors().size());
    const double denominator = skellam ? std::max(dp_expected, 1e-12) : survivors;
    const auto inv = static_cast<float>(1.0 / denominator);
    for (float& v : delta) v *= inv;
    if (skellam) {
      const auto sens = secagg::rounded_sensitivity(options.secagg.dp_clip_norm(), q.scale(),
                                                    sa->coords.length(global.size()));
      skellam->compose(dp_q, sens.l1, sens.l2, sa->client_variance * survivors);
    }
    close_round();
  }

  void reset_upload(Session& s) {
    s.rx.reset();
    s.reserved.reset();
    s.spill.reset();
    end_upload_turn(s);
  }

  // Upload turns: at most options.upload_concurrency uploads stream at once.
  void request_upload_turn(Session& s) {
    if (uploads_streaming < options.upload_concurrency) {
      return grant_upload(s);
    }
    upload_queue.push_back(s.id);
  }

  void grant_upload(Session& s) {
    ++uploads_streaming;
    most_streaming = std::max(most_streaming, uploads_streaming);
    s.upload_granted = true;
    s.last_progress = Clock::now();
    watch_stall(s, options.upload_stall_timeout);
    v1::Envelope go;
    go.mutable_chunk_ack()->set_transfer_id(s.upload.transfer().transfer_id());
    go.mutable_chunk_ack()->set_next_index(0);
    send(s, go);
  }

  // A granted upload that sends nothing for upload_stall_timeout loses its turn and is rejected,
  // so a client that stops mid-upload cannot hold a turn until its connection times out.
  void watch_stall(Session& s, Clock::duration after) {
    if (!s.stall_timer) s.stall_timer = std::make_unique<asio::steady_timer>(io);
    s.stall_timer->expires_after(after);
    s.stall_timer->async_wait([weak = weak_from_this(), id = s.id,
                               transfer =
                                   s.upload.transfer().transfer_id()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self) return;
      const auto it = self->sessions.find(id);
      if (it == self->sessions.end()) return;
      Session& t = it->second;
      if (!t.upload_granted || !t.rx || t.upload.transfer().transfer_id() != transfer) return;
      const auto quiet = Clock::now() - t.last_progress;
      if (quiet < self->options.upload_stall_timeout) {
        return self->watch_stall(t, self->options.upload_stall_timeout - quiet);
      }
      self->reject_update(
          t,
          deadline_exceeded(
              "no chunk for " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count()) +
              " ms after its upload turn began or its last chunk (upload stall "
              "timeout " +
              std::to_string(self->options.upload_stall_timeout.count()) +
              " ms); the turn goes to the next upload"));
    });
  }

  void end_upload_turn(Session& s) {
    if (!s.upload_granted) return;
    s.upload_granted = false;
    if (s.stall_timer) s.stall_timer->cancel();
    --uploads_streaming;
    while (!upload_queue.empty() && uploads_streaming < options.upload_concurrency) {
      const auto it = sessions.find(upload_queue.front());
      upload_queue.pop_front();
      // Gone, or its upload ended (rejected, round closed) while it waited.
      if (it == sessions.end() || !it->second.rx || it->second.upload_granted) continue;
      grant_upload(it->second);
    }
  }

  std::filesystem::path spill_dir() const {
    if (!options.spill_dir.empty()) return options.spill_dir;
    if (!options.state_dir.empty()) return std::filesystem::path(options.state_dir) / "spill";
    return std::filesystem::temp_directory_path();
  }

  void reject_update(Session& s, const Status& why) {
    if (sa && s.sa_index >= 0 && sa->stage == 2)
      sa->answered.insert(static_cast<uint32_t>(s.sa_index));
    ++rejected;
    if (options.monitor) options.monitor->update_rejected();
    s.submitted = true;
    reset_upload(s);
    if (async()) s.selected = false;
    spdlog::warn("aggregator: round {}: update from {} rejected: {}", round + 1, s.node_id,
                 why.to_string());
    send(s, error_envelope(v1::ERROR_CODE_BAD_REQUEST, "update rejected: " + why.message(), false));
    check_round_end();
  }

  void on_upload(Session& s, const v1::UpdateUpload& u) {
    const bool current = async() ? s.selected : u.round() == round + 1 && s.selected;
    if (!round_active || !current) {
      send(s, error_envelope(v1::ERROR_CODE_ROUND_CLOSED,
                             "round " + std::to_string(u.round()) + " is closed", true));
      return;
    }
    if (sa && (sa->stage != 2 || s.sa_index < 0)) {
      // A masked vector is taken only in the masked-input stage, from the clients that shared.
      send(s, error_envelope(v1::ERROR_CODE_ROUND_CLOSED,
                             "round " + std::to_string(u.round()) +
                                 " takes no upload from this client now (secure aggregation "
                                 "stage '" +
                                 kSecAggStages[sa->stage] + "')",
                             true));
      return;
    }
    if (s.submitted || s.rx) return reject_update(s, invalid_argument("second upload in a round"));
    if (u.base_version() != s.base_version) {
      return reject_update(
          s, invalid_argument("update against model version " + std::to_string(u.base_version()) +
                              ", sent " + std::to_string(s.base_version)));
    }
    if (const Status st = check_contributions(s, u); !st.ok()) return reject_update(s, st);
    // DP-FedAvg bounds each client's influence: every clipped update counts once.
    s.weight = options.dp.enabled() || sa ? 1.0f : static_cast<float>(u.num_samples());
    if (async()) {
      // Refused early when already too stale; the weight is set when it is folded.
      if (const Status st = check_staleness(s); !st.ok()) return reject_update(s, st);
    }
    // A leaf's weight is its clients' (checked against its contributions above).
    const uint64_t most_samples = s.leaf ? (1ull << 40) : (1ull << 24);
    if (u.num_samples() == 0 || u.num_samples() > most_samples) {
      return reject_update(s, invalid_argument("num_samples " + std::to_string(u.num_samples()) +
                                               " outside [1, 2^" + (s.leaf ? "40" : "24") + "]"));
    }
    const uint64_t limit =
        options.max_update_bytes ? options.max_update_bytes : global.size() * 8 + (1u << 20);
    // In memory while the uploads in flight fit the budget, else on disk: memory stays bounded
    // however many clients upload at once.
    s.reserved = MemoryReservation::take(&upload_memory_used, options.upload_memory_bytes,
                                         u.transfer().total_bytes());
    Result<net::ChunkReceiver> rx = unavailable("no receiver");
    // A large upload's SHA-256 runs on a helper thread of its own, off the I/O thread that
    // decrypts every connection's records: concurrent uploads hash on several cores.
    const auto hashing = u.transfer().total_bytes() >= options.background_hash_bytes
                             ? net::ChunkReceiver::Hashing::kBackground
                             : net::ChunkReceiver::Hashing::kInline;
    if (s.reserved || u.transfer().total_bytes() > limit) {
      rx = net::ChunkReceiver::create_buffered(u.transfer(), limit, hashing);
    } else {
      auto spill = SpillFile::create(spill_dir());
      if (!spill.ok()) return reject_update(s, spill.status());
      s.spill = std::move(*spill);
      rx = net::ChunkReceiver::create(
          u.transfer(), limit,
          [file = s.spill.get()](uint64_t offset, std::string_view data) {
            return file->write(offset, data);
          },
          hashing,
          // The helper thread hashes the spill file behind the writes (from the page cache):
          // nothing is copied for it and nothing waits for it in this process's memory.
          [file = s.spill.get()](uint64_t offset, std::span<char> out) {
            return file->read_at(offset, out);
          });
    }
    if (!rx.ok()) return reject_update(s, rx.status());
    s.rx.emplace(std::move(*rx));
    s.upload = u;
    if (u.transfer().num_chunks() == 0) return finish_upload(s);
    request_upload_turn(s);
  }

  // A client's upload lists no contributions and comes from a client not yet counted this
  // round; a leaf's lists its clients, each once and (in a synchronous round) not counted yet,
  // with weights in range that add up to the weight it uploads (its mean is folded with it).
  Status check_contributions(const Session& s, const v1::UpdateUpload& u) const {
    if (!s.leaf) {
      if (u.contributions_size() > 0) {
        return permission_denied("client " + s.node_id +
                                 " lists contributions: only a leaf aggregator's upload may "
                                 "(a certificate of role leaf)");
      }
      if (!async() && contributors.count(s.node_id)) {
        return invalid_argument("client " + s.node_id +
                                " already contributed to this round through a leaf");
      }
      return ok_status();
    }
    if (u.contributions_size() == 0) {
      return invalid_argument("leaf " + s.node_id +
                              " uploads a partial sum without the contributions behind it");
    }
    uint64_t sum = 0;
    std::set<std::string_view> seen;
    for (const auto& c : u.contributions()) {
      if (c.num_samples() == 0 || c.num_samples() > (1ull << 24)) {
        return invalid_argument("leaf " + s.node_id + " lists client '" + c.node_id() +
                                "' with weight " + std::to_string(c.num_samples()) +
                                ", outside [1, 2^24]");
      }
      // FedBuff folds a fast client's successive updates into one buffer: no round to count in.
      if (!seen.insert(c.node_id()).second || (!async() && contributors.count(c.node_id()))) {
        return invalid_argument("leaf " + s.node_id + " lists client '" + c.node_id() +
                                "', which already contributed to this round");
      }
      sum += c.num_samples();
    }
    if (sum != u.num_samples()) {
      return invalid_argument(
          "leaf " + s.node_id + " uploads weight " + std::to_string(u.num_samples()) + " but its " +
          std::to_string(u.contributions_size()) + " contributions sum to " + std::to_string(sum) +
          ": a partial sum must carry the weight of the clients it folds");
    }
    return ok_status();
  }

  Status check_staleness(const Session& s) const {
    const uint64_t staleness = version - s.base_version;
    if (staleness <= options.max_staleness) return ok_status();
    return invalid_argument("update " + std::to_string(staleness) + " versions stale (max " +
                            std::to_string(options.max_staleness) + ")");
  }

  void on_chunk(Session& s, const wire::ChunkView& c) {
    if (!s.rx || c.transfer_id != s.upload.transfer().transfer_id()) return;  // stale
    // Chunks wait for the grant: a client streaming before its turn would void the bound on
    // the receive buffers that the turns give.
    if (!s.upload_granted) {
      return reject_update(s, invalid_argument("chunk " + std::to_string(c.index) +
                                               " sent before the upload was granted its turn"));
    }
    s.last_progress = Clock::now();
    if (bytes_in == 0 && c.index == 0) crash_point("collecting");
    const Status st = s.rx->accept(c);
    if (options.monitor) options.monitor->bytes_received(c.data.size());
    if (st.code() == StatusCode::kDataLoss) {
      v1::Envelope ack;
      *ack.mutable_chunk_ack() = s.rx->ack();
      return send(s, ack);
    }
    if (!st.ok()) return reject_update(s, st);
    if (s.rx->all_received()) finish_upload(s);
  }

  void finish_upload(Session& s) {
    Status st = s.rx->finish();
    if (!st.ok()) return reject_update(s, st);
    // An update stream is folded straight from the spill file, a window at a time; anything
    // else (a protobuf EncodedUpdate from an older client) is read whole.
    const bool stream = s.upload.transfer().content_type() == edge_client::kUpdateStreamContentType;
    const uint64_t total = s.upload.transfer().total_bytes();
    std::unique_ptr<SpillFile> spill = std::move(s.spill);
    std::string payload;
    if (!spill) {
      payload = s.rx->take_payload();
    } else if (!stream) {
      auto bytes = spill->read(total);
      if (!bytes.ok()) return reject_update(s, bytes.status());
      payload = std::move(*bytes);
    }
    reset_upload(s);
    // Again at the fold: two leaves uploading at once may list the same client.
    if (st = check_contributions(s, s.upload); !st.ok()) return reject_update(s, st);
    if (sa) {
      // A masked vector, read whole from memory or its spill file (it is masked either way).
      spill.reset();
      if (!fold_masked(s, std::move(payload))) return;
    } else if (async()) {
      // FedBuff's staleness is counted when the update is applied: server steps taken since
      // its model was sent, including those taken while it was uploading.
      st = check_staleness(s);
      if (!st.ok()) return reject_update(s, st);
      s.staleness = version - s.base_version;
      s.weight = fedbuff_staleness_weight(s.staleness);
    }
    const auto fold_start = Clock::now();
    if (sa) {
      // added to the secure sum above
    } else if (spill && stream) {
      st = accumulator.fold_stream(
          [file = spill.get()](uint64_t offset, std::span<char> out) {
            return file->read_at(offset, out);
          },
          total, s.weight);
    } else if (stream) {
      st = accumulator.fold_payload(payload, s.weight);
    } else {
      st = accumulator.fold_bytes(payload, s.weight);
    }
    spill.reset();
    fold_seconds += std::chrono::duration<double>(Clock::now() - fold_start).count();
    if (!st.ok()) return reject_update(s, st);
    if (!sa) crash_point("folding");
    s.submitted = true;
    if (s.leaf) {
      for (const auto& c : s.upload.contributions()) {
        contributors.insert(c.node_id());
        contributions.push_back(c);
      }
    } else {
      contributors.insert(s.node_id);
      auto& c = contributions.emplace_back();
      c.set_node_id(s.node_id);
      c.set_num_samples(s.upload.num_samples());
    }
    if (async()) {
      s.selected = false;
      staleness_sum += static_cast<double>(s.staleness);
      staleness_max = std::max(staleness_max, s.staleness);
    }
    bytes_in += total;
    if (options.monitor) options.monitor->update_folded();
    loss_sum += static_cast<double>(s.upload.train_loss()) * static_cast<double>(s.weight);
    v1::Envelope ack;
    ack.mutable_chunk_ack()->set_transfer_id(s.upload.transfer().transfer_id());
    ack.mutable_chunk_ack()->set_next_index(s.upload.transfer().num_chunks());
    ack.mutable_chunk_ack()->set_complete(true);
    send(s, ack);
    check_round_end();
  }

  void check_round_end() {
    if (!round_active) return;
    if (sa) return maybe_close_secagg_stage();
    if (accumulator.count() >= target) return close_round();
    if (async()) return post_start();
    const bool outstanding = std::any_of(sessions.begin(), sessions.end(), [](const auto& p) {
      return p.second.selected && !p.second.submitted;
    });
    if (!outstanding) end_partial_round();
  }

  void end_partial_round() {
    // A DP round is one Poisson sample: it closes with what came, however few (see dp.h).
    if (accountant ||
        accumulator.count() >= static_cast<int>(std::max<uint32_t>(options.min_updates, 1))) {
      return close_round();
    }
    if (options.leaf) {
      return fail_leaf_round(deadline_exceeded(
          "round " + std::to_string(round + 1) + " of the leaf closed with " +
          std::to_string(accumulator.count()) + " update(s), rounds.min_updates is " +
          std::to_string(options.min_updates)));
    }
    spdlog::warn("aggregator: round {} failed ({} updates, {} needed); retrying", round + 1,
                 accumulator.count(), options.min_updates);
    round_active = false;
    ++attempt;
    deadline_timer.cancel();
    for (auto& [sid, s] : sessions) s.selected = false;
    post_start();
  }

  // Ends the synchronous round in progress for every session: nobody is selected, nobody
  // waiting is granted an upload turn, uploads under way stop, connections get their usual idle
  // deadline back.
  void end_round_sessions() {
    round_active = false;
    deadline_timer.cancel();
    upload_queue.clear();
    for (auto& [sid, s] : sessions) {
      s.selected = false;
      reset_upload(s);
      s.conn->set_idle_deadline(options.server.connection.deadlines.idle);
    }
  }

  void close_round() {
    if (!async()) end_round_sessions();
    RoundReport report;
    report.round = round + 1;
    report.selected = selected;
    report.updates = accumulator.count();
    report.rejected = rejected;
    report.lost = lost;
    report.clipped = accumulator.clipped();
    report.total_weight = accumulator.total_weight();
    report.mean_train_loss = accumulator.count() > 0 ? loss_sum / accumulator.total_weight() : 0.0;
    report.update_bytes = bytes_in;
    report.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    report.registered = registered_at_start;
    report.most_uploads_streaming = static_cast<int>(most_streaming);
    report.fold_seconds = fold_seconds;
    report.fold_gbps = fold_seconds > 0 ? static_cast<double>(bytes_in) / fold_seconds / 1e9 : 0.0;
    report.receive_gbps =
        report.seconds > 0 ? static_cast<double>(bytes_in) / report.seconds / 1e9 : 0.0;

    // The round's step, made in place in the accumulator's sum (reset before the next fold).
    const std::span<float> delta = accumulator.mutable_sum();
    if (sa) {
      // finish_secagg() has set delta from the unmasked sum.
      sa->timer.cancel();
      const auto survivors = static_cast<int>(sa->server->survivors().size());
      report.updates = survivors;
      report.total_weight = survivors;
      report.mean_train_loss = survivors > 0 ? loss_sum / survivors : 0.0;
      report.clipped = 0;
      report.secagg_survivors = survivors;
      report.secagg_dropped = static_cast<int>(sa->server->shared().size()) - survivors;
      report.secagg_degree = static_cast<int>(sa->server->params().degree);
      report.secagg_threshold = static_cast<int>(sa->server->params().threshold);
      report.secagg_stage_bytes = sa->bytes;
      if (skellam) {
        report.dp_sampling_rate = dp_q;
        report.dp_expected_updates = dp_expected;
        report.dp_epsilon = skellam->spent(options.secagg.dp_delta()).epsilon;
      }
      for (auto& [sid, s] : sessions) s.sa_index = -1;
      sa.reset();  // the unmasked sum is in delta; the session's buffers go
    } else if (accountant) {
      // Fixed denominator: the expected number of updates, so that one client's influence on
      // the mean is at most clip_norm / expected whatever the others sent.
      const double expected = std::max(dp_expected, 1e-12);
      for (float& v : delta) v = static_cast<float>(v / expected);
      const double noise_std = options.dp.noise_multiplier * options.dp.clip_norm / expected;
      const Status noised = dp_source->add_gaussian(delta, noise_std);
      if (!noised.ok()) {
        error = noised.with_context("DP noise of round " + std::to_string(round + 1));
        spdlog::error("aggregator: {}", error.to_string());
        return finish();
      }
      accountant->compose(dp_q, options.dp.noise_multiplier);
      report.dp_noise_std = noise_std;
      report.dp_sampling_rate = dp_q;
      report.dp_expected_updates = dp_expected;
      report.dp_epsilon = accountant->spent(options.dp.delta).epsilon;
    } else if (async() && options.rule.rule == RobustRule::kMean) {
      // FedBuff: the staleness-weighted sum over K, the updates in the buffer.
      const double k = accumulator.count();
      for (float& v : delta) v = static_cast<float>(v / k);
      report.mean_staleness = staleness_sum / k;
      report.max_staleness = staleness_max;
    } else {
      accumulator.mean_into(delta);
      report.excluded = accumulator.excluded();
    }
    if (options.leaf) return close_leaf_round(report, delta);
    own_global();
    optimizer.apply(global, delta);
    crash_point("stepped");
    ++round;
    ++version;
    attempt = 0;
    if (!options.state_dir.empty()) {
      RoundState st;
      st.round = round;
      st.model_version = version;
      st.strategy = std::string(strategy_name(options.strategy.kind));
      st.global.assign(global.begin(), global.end());
      for (auto& [name, slot] : optimizer.slots()) st.slots.emplace_back(name, *slot);
      if (accountant) st.dp_rdp.assign(accountant->rdp().begin(), accountant->rdp().end());
      if (skellam) st.dp_rdp.assign(skellam->rdp().begin(), skellam->rdp().end());
      const Status saved = save_round_state(options.state_dir, layout, st,
                                            [this] { crash_point("writing", round); });
      crash_point("closed", round);
      if (!saved.ok()) {
        error = saved.with_context("checkpoint after round " + std::to_string(round));
        spdlog::error("aggregator: {}", error.to_string());
        return finish();
      }
    }
    spdlog::info(
        "aggregator: round {} closed: {} updates ({} rejected{}), weight {}, loss {:.4f}; {:.3f} "
        "GB/s received, {:.2f} GB/s folded",
        report.round, report.updates, report.rejected,
        report.lost ? fmt::format(", {} lost by their trainers", report.lost) : "",
        report.total_weight, report.mean_train_loss, report.receive_gbps, report.fold_gbps);
    if (accountant) {
      spdlog::info(
          "aggregator: round {}: DP: {} of {} updates clipped to L2 norm {:g}, noise std {:.3g} "
          "(multiplier {:g}, {:.4g} expected updates), q {:.4g}, epsilon {:.4f} at delta {:g}",
          report.round, report.clipped, report.updates, options.dp.clip_norm, report.dp_noise_std,
          options.dp.noise_multiplier, report.dp_expected_updates, report.dp_sampling_rate,
          report.dp_epsilon, options.dp.delta);
    }
    if (report.secagg_degree > 0) {
      spdlog::info(
          "aggregator: round {}: secure aggregation: {} survivors, {} dropped (degree {}, "
          "threshold {}); bytes advertise {}, share keys {}, masked input {}, unmask {}{}",
          report.round, report.secagg_survivors, report.secagg_dropped, report.secagg_degree,
          report.secagg_threshold, report.secagg_stage_bytes[0], report.secagg_stage_bytes[1],
          report.secagg_stage_bytes[2], report.secagg_stage_bytes[3],
          skellam
              ? fmt::format("; distributed DP: q {:.4g}, epsilon {:.4f} at delta {:g}",
                            report.dp_sampling_rate, report.dp_epsilon, options.secagg.dp_delta())
              : "");
    }
    if (options.monitor) options.monitor->round_closed(report);
    if (async()) {  // the buffer restarts; clients in flight keep training
      accumulator.reset();
      selected = 0;
      rejected = 0;
      lost = 0;
      loss_sum = 0.0;
      bytes_in = 0;
      fold_seconds = 0.0;
      staleness_sum = 0.0;
      staleness_max = 0;
      most_streaming = uploads_streaming;
      started = Clock::now();
      contributions.clear();
      contributors.clear();
    }
    bool go_on = true;
    if (hook) go_on = hook(report, global);
    if (!go_on || round >= options.num_rounds) return finish();
    post_start();
  }

  // ---- Leaf mode (AggregatorOptions::leaf, aggregator/leaf.h) ----

  void lead_round(const v1::RoundPlan& plan, std::vector<float> model,
                  std::chrono::milliseconds window, LeafDone cb) {
    if (!options.leaf) {
      return cb(failed_precondition("lead_round on an aggregator that is not a leaf"));
    }
    if (done) return cb(failed_precondition("the leaf's federation has ended"));
    if (leaf_done || round_active) {
      fail_leaf_round(unavailable("the tier above started round " + std::to_string(plan.round())));
    }
    if (model.size() != global.size()) {
      return cb(invalid_argument("the tier above sent a model of " + std::to_string(model.size()) +
                                 " parameters, this leaf's has " + std::to_string(global.size())));
    }
    if (plan.round() == 0) return cb(invalid_argument("round 0 from the tier above"));
    own_global();
    std::copy(model.begin(), model.end(), global.begin());
    std::vector<float>().swap(model);
    round = plan.round() - 1;
    version = plan.model_version();
    attempt = 0;
    leaf_plan = plan;
    leaf_done = std::move(cb);
    leaf_until = Clock::now() + window;
    const uint64_t id = ++leaf_requests;
    leaf_timer.expires_at(leaf_until);
    leaf_timer.async_wait([weak = weak_from_this(), id](const asio::error_code& ec) {
      auto self = weak.lock();
      // A round under way closes at its own deadline, which ends within the window.
      if (ec || !self || self->leaf_requests != id || !self->leaf_done || self->round_active) {
        return;
      }
      self->fail_leaf_round(deadline_exceeded(
          "round " + std::to_string(self->round + 1) + ": " +
          std::to_string(self->registered_count()) +
          " client(s) connected when the leaf's window closed, rounds.min_available is " +
          std::to_string(self->options.min_available)));
    });
    spdlog::info("aggregator: leaf: round {} (model version {}) from the tier above, {} ms",
                 plan.round(), plan.model_version(), window.count());
    post_start();
  }

  // Ends the leaf's round in progress (if any) without a result and tells its caller why.
  void fail_leaf_round(const Status& why) {
    if (round_active) end_round_sessions();
    leaf_timer.cancel();
    leaf_plan.reset();
    LeafDone cb = std::move(leaf_done);
    leaf_done = nullptr;
    if (!cb) return;
    spdlog::warn("aggregator: leaf: round {} failed: {}", round + 1, why.to_string());
    cb(why);
  }

  // close_round's end on a leaf: the mean goes up instead of stepping the model.
  void close_leaf_round(RoundReport& report, std::span<const float> mean) {
    LeafResult r;
    r.mean.assign(mean.begin(), mean.end());
    r.total_weight = accumulator.total_weight();
    r.contributions = std::move(contributions);
    contributions.clear();
    contributors.clear();
    round = report.round;
    spdlog::info(
        "aggregator: leaf: round {} closed: {} updates ({} rejected), weight {}, loss {:.4f}; "
        "{:.3f} GB/s received, {:.2f} GB/s folded; the mean goes up",
        report.round, report.updates, report.rejected, report.total_weight, report.mean_train_loss,
        report.receive_gbps, report.fold_gbps);
    if (options.monitor) options.monitor->round_closed(report);
    if (hook) (void)hook(report, global);  // metrics; the tier above decides when the run ends
    r.report = report;
    leaf_timer.cancel();
    leaf_plan.reset();
    LeafDone cb = std::move(leaf_done);
    leaf_done = nullptr;
    if (cb) cb(std::move(r));
  }

  void set_access(AccessPolicy policy) {
    options.access = std::move(policy);
    std::vector<uint64_t> closing;
    for (auto& [id, s] : sessions) {
      if (!s.registered) continue;
      const std::string refused =
          options.access.refusal(s.conn->peer().node_id, s.conn->peer().serial);
      if (refused.empty()) continue;
      spdlog::warn("aggregator: closing the session of {}: {}", s.conn->peer().describe(), refused);
      if (options.monitor) options.monitor->identity_refused(s.node_id, refused);
      closing.push_back(id);
    }
    // Closed at once (a reconnect meets the same check, or the CRL at the handshake); on_close
    // forgets the session and ends the round early if it was the last one outstanding.
    for (uint64_t id : closing) {
      const auto it = sessions.find(id);
      if (it != sessions.end()) it->second.conn->abort(permission_denied("access revoked"));
    }
  }

  void finish_session(Session& s) {
    if (s.pump) s.pump->cancel();
    send(s, error_envelope(v1::ERROR_CODE_UNSPECIFIED,
                           std::string(edge_client::kFederationComplete), false));
    s.conn->close();
  }

  // Heartbeats to the registered clients every heartbeat_interval until the federation ends.
  void schedule_heartbeat() {
    if (options.heartbeat_interval.count() <= 0 || done) return;
    heartbeat_timer.expires_after(options.heartbeat_interval);
    heartbeat_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->done) return;
      const v1::Envelope hb = net::make_heartbeat();
      for (auto& [sid, s] : self->sessions) {
        if (s.registered && s.conn->is_open()) (void)s.conn->send(hb);
      }
      self->schedule_heartbeat();
    });
  }

  void finish() {
    done = true;
    heartbeat_timer.cancel();
    for (auto& [sid, s] : sessions) finish_session(s);
    spdlog::info("aggregator: federation complete after {} rounds", round);
  }
};

Result<std::unique_ptr<Aggregator>> Aggregator::create(asio::io_context& io,
                                                       std::shared_ptr<asio::ssl::context> ctx,
                                                       AggregatorOptions options,
                                                       compress::Layout layout,
                                                       std::vector<float> initial, RoundHook hook) {
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout), "aggregator");
  if (options.download_window_bytes == 0 || options.upload_concurrency == 0) {
    return invalid_argument(
        "aggregator: download_window_bytes and upload_concurrency must be "
        "positive");
  }
  if (options.dp.enabled()) {
    if (options.rule.rule != RobustRule::kMean || options.buffer_size > 0) {
      return invalid_argument(
          "aggregator: central DP needs the MEAN rule and synchronous rounds (buffer_size 0)");
    }
    if (!(options.dp.noise_multiplier >= 0) || !(options.dp.delta > 0 && options.dp.delta < 1)) {
      return invalid_argument("aggregator: DP noise_multiplier must be >= 0, delta in (0, 1)");
    }
    if (options.dp.simulation_seed != 0 && !options.simulation) {
      return invalid_argument(
          "aggregator: dp.simulation_seed makes the DP noise reproducible by anyone who has the "
          "config; it is refused outside a simulation (`starling aggregator --simulate`, "
          "`starling simulate`). Remove it: real runs draw the noise from OpenSSL's DRBG");
    }
    options.rule.clip_norm = options.dp.clip_norm;
  }
  if (options.secagg.enabled()) {
    if (options.rule.rule != RobustRule::kMean || options.rule.clip_norm > 0 ||
        options.buffer_size > 0 || options.dp.enabled()) {
      return invalid_argument(
          "aggregator: secure aggregation needs the MEAN rule without clipping, synchronous "
          "rounds (buffer_size 0) and no central DP: the aggregator sees only the sum");
    }
    if (options.secagg_stage_timeout.count() <= 0) {
      return invalid_argument("aggregator: secagg_stage_timeout must be positive");
    }
  }
  if (options.leaf && (options.dp.enabled() || options.secagg.enabled() || options.buffer_size)) {
    return invalid_argument(
        "aggregator: a leaf runs synchronous rounds without DP or secure aggregation (neither "
        "is built across tiers; FedBuff runs at the root)");
  }
  if (numel != static_cast<int64_t>(initial.size())) {
    return invalid_argument("aggregator: initial model has " + std::to_string(initial.size()) +
                            " values, layout " + std::to_string(numel));
  }
  auto impl = std::make_shared<Impl>(io, std::move(options), std::move(layout), std::move(initial),
                                     std::move(hook));
  RETURN_IF_ERROR(impl->resume());
  impl->schedule_heartbeat();
  std::weak_ptr<Impl> weak = impl;
  ASSIGN_OR_RETURN(
      impl->server,
      net::Server::listen(
          io, std::move(ctx), impl->options.server,
          [weak](std::shared_ptr<net::Connection> c) {
            if (auto self = weak.lock()) self->accept(std::move(c));
          },
          [weak](const Status& st) {
            spdlog::warn("aggregator: refused: {}", st.to_string());
            auto self = weak.lock();
            if (self && self->options.monitor && st.code() == StatusCode::kUnauthenticated) {
              self->options.monitor->handshake_refused(st.message());
            }
          }),
      "aggregator");
  return std::unique_ptr<Aggregator>(new Aggregator(std::move(impl)));
}

Aggregator::~Aggregator() {
  if (!impl_) return;
  impl_->server->stop();
  impl_->deadline_timer.cancel();
  impl_->heartbeat_timer.cancel();
  impl_->leaf_timer.cancel();
  if (impl_->sa) impl_->sa->timer.cancel();
  auto sessions = std::move(impl_->sessions);
  impl_->sessions.clear();
  for (auto& [id, s] : sessions) s.conn->abort(unavailable("aggregator stopped"));
}

uint16_t Aggregator::port() const { return impl_->server->port(); }
uint64_t Aggregator::rounds_completed() const { return impl_->round; }
bool Aggregator::done() const { return impl_->done; }
const Status& Aggregator::error() const { return impl_->error; }
std::span<const float> Aggregator::global() const { return impl_->global; }
size_t Aggregator::registered_clients() const { return impl_->registered_count(); }
void Aggregator::set_access(AccessPolicy policy) { impl_->set_access(std::move(policy)); }
int Aggregator::round_updates() const {
  return impl_->round_active ? impl_->accumulator.count() : 0;
}
void Aggregator::lead_round(const v1::RoundPlan& plan, std::vector<float> model,
                            std::chrono::milliseconds window, LeafDone done) {
  impl_->lead_round(plan, std::move(model), window, std::move(done));
}
void Aggregator::abandon_round(const Status& why) { impl_->fail_leaf_round(why); }
void Aggregator::end_federation() {
  impl_->fail_leaf_round(unavailable("the federation ended"));
  if (!impl_->done) impl_->finish();
}

}  // namespace starling::aggregator
