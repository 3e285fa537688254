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

#include "aggregator/accumulator.h"
#include "aggregator/monitor.h"
#include "aggregator/round_state.h"
#include "aggregator/upload_spill.h"
#include "core/net/chunk_stream.h"
#include "core/net/hello.h"
#include "core/util/rng.h"
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
    std::optional<net::ChunkReceiver> rx;
    // Where rx's bytes go: memory (reserved from the shared budget) or a spill file.
    std::unique_ptr<MemoryReservation> reserved;
    std::unique_ptr<SpillFile> spill;
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
  };

  Impl(asio::io_context& io_ctx, AggregatorOptions opts, compress::Layout lay,
       std::vector<float> initial, RoundHook h)
      : io(io_ctx),
        options(std::move(opts)),
        layout(std::move(lay)),
        global(std::move(initial)),
        optimizer(options.strategy, static_cast<int64_t>(global.size())),
        accumulator(static_cast<int64_t>(global.size()), options.rule),
        delta(global.size()),
        hook(std::move(h)),
        deadline_timer(io_ctx) {
    if (options.dp.enabled()) accountant.emplace();
  }

  asio::io_context& io;
  AggregatorOptions options;
  compress::Layout layout;
  std::vector<float> global;
  ServerOptimizer optimizer;
  UpdateAccumulator accumulator;
  std::vector<float> delta;
  RoundHook hook;
  std::optional<RdpAccountant> accountant;  // central DP only
  // Central DP: this round's randomness (Poisson sampling, then the noise), its sampling rate
  // and fixed denominator.
  std::optional<NoiseSource> dp_source;
  double dp_q = 0.0;
  double dp_expected = 0.0;
  std::unique_ptr<net::Server> server;
  asio::steady_timer deadline_timer;

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
  double staleness_sum = 0.0;  // FedBuff, this round
  uint64_t staleness_max = 0;
  Clock::time_point started;
  // The model payload of the current version, shared by every dispatch.
  std::shared_ptr<const std::string> model_bytes;
  uint64_t payload_version = ~0ull;
  uint64_t dispatches = 0;

  bool async() const { return options.buffer_size > 0; }

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
    if (accountant) {
      // A state written without DP (or with another order set) cannot say what was spent.
      RETURN_IF_ERROR(accountant->restore(std::move(st->dp_rdp)),
                      "resuming the DP accountant from " + options.state_dir);
    }
    global = std::move(st->global);
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
      spdlog::info("aggregator: client {} left ({})", it->second.node_id, st.to_string());
    }
    const bool was_outstanding = it->second.selected && !it->second.submitted;
    const bool was_registered = it->second.registered;
    reset_upload(it->second);  // gives back its upload turn
    sessions.erase(it);
    if (options.monitor && was_registered) options.monitor->set_registered(registered_count());
    if (async()) {
      post_start();
    } else if (round_active && was_outstanding) {
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
      case v1::Envelope::kChunk:
        return on_chunk(s, e.chunk());
      case v1::Envelope::kChunkAck:
        if (s.pump && e.chunk_ack().transfer_id() == s.pump->header().transfer_id() &&
            !e.chunk_ack().complete()) {
          s.pump->resume_from(e.chunk_ack().next_index());
        }
        return;
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
    if (hello.role() != v1::ROLE_CLIENT) {
      return reject_peer(s, v1::ERROR_CODE_PERMISSION_DENIED,
                         permission_denied("only clients may join a federation"));
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
    v1::Envelope reply;
    *reply.mutable_hello() = net::make_hello(options.node_id, v1::ROLE_AGGREGATOR, {options.codec},
                                             wire::kDefaultMaxFrameBytes);
    send(s, reply);
    spdlog::info("aggregator: client {} registered ({} connected)", s.node_id, registered_count());
    if (options.monitor) options.monitor->set_registered(registered_count());
    post_start();
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

  std::shared_ptr<const std::string> model_payload() {
    if (!model_bytes || payload_version != version) {
      model_bytes = std::make_shared<const std::string>(edge_client::to_f32_bytes(global));
      payload_version = version;
    }
    return model_bytes;
  }

  void dispatch(Session& s) {
    s.selected = true;
    s.submitted = false;
    reset_upload(s);
    s.base_version = version;
    v1::Envelope plan;
    auto* p = plan.mutable_round_plan();
    p->set_round(round + 1);
    p->set_model_version(version);
    p->set_local_steps(options.local_steps);
    p->set_batch_size(options.batch_size);
    p->set_learning_rate(options.learning_rate);
    p->set_codec(options.codec);
    p->set_deadline_unix_ms(unix_ms_after(options.round_deadline));
    p->set_seed(Rng(options.seed).fork(round + 1).fork(fnv1a(s.node_id)).next_u64());
    send(s, plan);
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

  void maybe_start_round() {
    if (done) return;
    if (async()) return dispatch_async();
    if (round_active) return;
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
    if (accountant) {
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
    target = static_cast<int>(accountant ? pick : want);
    selected = static_cast<int>(pick);
    registered_at_start = static_cast<int>(registered_count());
    rejected = 0;
    lost = 0;
    loss_sum = 0.0;
    bytes_in = 0;
    most_streaming = uploads_streaming;
    accumulator.reset();
    round_active = true;
    started = Clock::now();

    for (size_t i = 0; i < pick; ++i) dispatch(*idle[i]);
    if (options.monitor) options.monitor->round_started(round + 1, static_cast<int>(pick));
    if (accountant) {
      spdlog::info(
          "aggregator: round {} started: {} drawn by Poisson sampling at q = {:.4g} ({} "
          "available, {:.4g} expected)",
          round + 1, pick, dp_q, available, dp_expected);
      if (pick == 0) {  // nobody drawn: the round releases noise alone, and is accounted
        return close_round();
      }
    } else {
      spdlog::info("aggregator: round {} started: {} selected for {} updates ({} available)",
                   round + 1, pick, want, available);
    }
    deadline_timer.expires_after(options.round_deadline);
    deadline_timer.async_wait(
        [weak = weak_from_this(), r = round, a = attempt](const asio::error_code& ec) {
          auto self = weak.lock();
          if (ec || !self || !self->round_active || self->round != r || self->attempt != a) return;
          spdlog::warn("aggregator: round {} deadline passed with {} of {} updates", r + 1,
                       self->accumulator.count(), self->target);
          self->end_partial_round();
        });
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
    if (s.submitted || s.rx) return reject_update(s, invalid_argument("second upload in a round"));
    if (u.base_version() != s.base_version) {
      return reject_update(
          s, invalid_argument("update against model version " + std::to_string(u.base_version()) +
                              ", sent " + std::to_string(s.base_version)));
    }
    // DP-FedAvg bounds each client's influence: every clipped update counts once.
    s.weight = options.dp.enabled() ? 1.0f : static_cast<float>(u.num_samples());
    if (async()) {
      // Refused early when already too stale; the weight is set when it is folded.
      if (const Status st = check_staleness(s); !st.ok()) return reject_update(s, st);
    }
    if (u.num_samples() == 0 || u.num_samples() > (1ull << 24)) {
      return reject_update(s, invalid_argument("num_samples " + std::to_string(u.num_samples()) +
                                               " outside [1, 2^24]"));
    }
    const uint64_t limit =
        options.max_update_bytes ? options.max_update_bytes : global.size() * 8 + (1u << 20);
    // In memory while the uploads in flight fit the budget, else on disk: memory stays bounded
    // however many clients upload at once.
    s.reserved = MemoryReservation::take(&upload_memory_used, options.upload_memory_bytes,
                                         u.transfer().total_bytes());
    Result<net::ChunkReceiver> rx = unavailable("no receiver");
    if (s.reserved || u.transfer().total_bytes() > limit) {
      rx = net::ChunkReceiver::create_buffered(u.transfer(), limit);
    } else {
      auto spill = SpillFile::create(spill_dir());
      if (!spill.ok()) return reject_update(s, spill.status());
      s.spill = std::move(*spill);
      rx = net::ChunkReceiver::create(
          u.transfer(), limit, [file = s.spill.get()](uint64_t offset, std::string_view data) {
            return file->write(offset, data);
          });
    }
    if (!rx.ok()) return reject_update(s, rx.status());
    s.rx.emplace(std::move(*rx));
    s.upload = u;
    if (u.transfer().num_chunks() == 0) return finish_upload(s);
    request_upload_turn(s);
  }

  Status check_staleness(const Session& s) const {
    const uint64_t staleness = version - s.base_version;
    if (staleness <= options.max_staleness) return ok_status();
    return invalid_argument("update " + std::to_string(staleness) + " versions stale (max " +
                            std::to_string(options.max_staleness) + ")");
  }

  void on_chunk(Session& s, const v1::Chunk& c) {
    if (!s.rx || c.transfer_id() != s.upload.transfer().transfer_id()) return;  // stale
    // Chunks wait for the grant: a client streaming before its turn would void the bound on
    // the receive buffers that the turns give.
    if (!s.upload_granted) {
      return reject_update(s, invalid_argument("chunk " + std::to_string(c.index()) +
                                               " sent before the upload was granted its turn"));
    }
    s.last_progress = Clock::now();
    if (bytes_in == 0 && c.index() == 0) crash_point("collecting");
    const Status st = s.rx->accept(c);
    if (options.monitor) options.monitor->bytes_received(c.data().size());
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
    if (async()) {
      // FedBuff's staleness is counted when the update is applied: server steps taken since
      // its model was sent, including those taken while it was uploading.
      st = check_staleness(s);
      if (!st.ok()) return reject_update(s, st);
      s.staleness = version - s.base_version;
      s.weight = fedbuff_staleness_weight(s.staleness);
    }
    if (spill && stream) {
      st = accumulator.fold_stream(
          [file = spill.get()](uint64_t offset, std::span<char> out) {
            return file->read_at(offset, out);
          },
          total, s.weight);
    } else if (stream) {
      st = accumulator.fold_stream(compress::read_from_memory(payload), payload.size(), s.weight);
    } else {
      st = accumulator.fold_bytes(payload, s.weight);
    }
    spill.reset();
    if (!st.ok()) return reject_update(s, st);
    crash_point("folding");
    s.submitted = true;
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
    spdlog::warn("aggregator: round {} failed ({} updates, {} needed); retrying", round + 1,
                 accumulator.count(), options.min_updates);
    round_active = false;
    ++attempt;
    deadline_timer.cancel();
    for (auto& [sid, s] : sessions) s.selected = false;
    post_start();
  }

  void close_round() {
    if (!async()) {
      round_active = false;
      deadline_timer.cancel();
      upload_queue.clear();  // nobody waiting is granted a turn for a closed round
      for (auto& [sid, s] : sessions) {
        s.selected = false;
        reset_upload(s);
      }
    }
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

    if (accountant) {
      // Fixed denominator: the expected number of updates, so that one client's influence on
      // the mean is at most clip_norm / expected whatever the others sent.
      const double expected = std::max(dp_expected, 1e-12);
      const auto sum = accumulator.sum();
      for (size_t i = 0; i < delta.size(); ++i) {
        delta[i] = static_cast<float>(sum[i] / expected);
      }
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
      const auto sum = accumulator.sum();
      const double k = accumulator.count();
      for (size_t i = 0; i < delta.size(); ++i) delta[i] = static_cast<float>(sum[i] / k);
      report.mean_staleness = staleness_sum / k;
      report.max_staleness = staleness_max;
    } else {
      accumulator.mean_into(delta);
      report.excluded = accumulator.excluded();
    }
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
      st.global = global;
      for (auto& [name, slot] : optimizer.slots()) st.slots.emplace_back(name, *slot);
      if (accountant) st.dp_rdp.assign(accountant->rdp().begin(), accountant->rdp().end());
      const Status saved = save_round_state(options.state_dir, layout, st,
                                            [this] { crash_point("writing", round); });
      crash_point("closed", round);
      if (!saved.ok()) {
        error = saved.with_context("checkpoint after round " + std::to_string(round));
        spdlog::error("aggregator: {}", error.to_string());
        return finish();
      }
    }
    spdlog::info("aggregator: round {} closed: {} updates ({} rejected{}), weight {}, loss {:.4f}",
                 report.round, report.updates, report.rejected,
                 report.lost ? fmt::format(", {} lost by their trainers", report.lost) : "",
                 report.total_weight, report.mean_train_loss);
    if (accountant) {
      spdlog::info(
          "aggregator: round {}: DP: {} of {} updates clipped to L2 norm {:g}, noise std {:.3g} "
          "(multiplier {:g}, {:.4g} expected updates), q {:.4g}, epsilon {:.4f} at delta {:g}",
          report.round, report.clipped, report.updates, options.dp.clip_norm, report.dp_noise_std,
          options.dp.noise_multiplier, report.dp_expected_updates, report.dp_sampling_rate,
          report.dp_epsilon, options.dp.delta);
    }
    if (options.monitor) options.monitor->round_closed(report);
    if (async()) {  // the buffer restarts; clients in flight keep training
      accumulator.reset();
      selected = 0;
      rejected = 0;
      lost = 0;
      loss_sum = 0.0;
      bytes_in = 0;
      staleness_sum = 0.0;
      staleness_max = 0;
      most_streaming = uploads_streaming;
      started = Clock::now();
    }
    bool go_on = true;
    if (hook) go_on = hook(report, global);
    if (!go_on || round >= options.num_rounds) return finish();
    post_start();
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

  void finish() {
    done = true;
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
  if (numel != static_cast<int64_t>(initial.size())) {
    return invalid_argument("aggregator: initial model has " + std::to_string(initial.size()) +
                            " values, layout " + std::to_string(numel));
  }
  auto impl = std::make_shared<Impl>(io, std::move(options), std::move(layout), std::move(initial),
                                     std::move(hook));
  RETURN_IF_ERROR(impl->resume());
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

}  // namespace starling::aggregator
