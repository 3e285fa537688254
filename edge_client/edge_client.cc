// The edge client's connection loop and round handling.
#include "edge_client/edge_client.h"

#include <spdlog/spdlog.h>

#include <asio/steady_timer.hpp>
#include <chrono>
#include <csignal>
#include <map>
#include <optional>

#include "core/net/chunk_stream.h"
#include "core/net/hello.h"
#include "core/secagg/encode.h"
#include "core/secagg/protocol.h"
#include "edge_client/client_state.h"
#include "edge_client/transfer.h"

namespace starling::edge_client {

struct EdgeClient::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io_ctx, std::shared_ptr<asio::ssl::context> c, EdgeClientOptions o,
       LocalTrainer& t)
      : io(io_ctx),
        ctx(std::move(c)),
        options(std::move(o)),
        trainer(t),
        backoff(options.backoff, Rng(options.seed).fork(1)),
        retry_timer(io_ctx),
        heartbeat_timer(io_ctx) {
    const auto n = compress::validate_layout(trainer.layout());
    numel = n.ok() ? *n : 0;
  }

  asio::io_context& io;
  std::shared_ptr<asio::ssl::context> ctx;
  EdgeClientOptions options;
  LocalTrainer& trainer;
  net::Backoff backoff;
  asio::steady_timer retry_timer;
  asio::steady_timer heartbeat_timer;
  int64_t numel = 0;

  std::shared_ptr<net::Connection> conn;
  bool server_hello = false;
  std::optional<v1::RoundPlan> plan;
  std::optional<net::ChunkReceiver> rx;
  uint64_t rx_transfer = 0;
  std::shared_ptr<ChunkPump> pump;
  uint64_t next_transfer = 1;
  // One codec per spec string, kept across rounds (and reconnects) for error feedback: the
  // trainer's own encoder where it has one (LocalTrainer::make_encoder: a GPU trainer encodes on
  // the device), else a host codec of `delta`.
  std::map<std::string, std::unique_ptr<compress::Codec>> codecs;
  std::map<std::string, std::unique_ptr<UpdateEncoder>> encoders;  // null: the trainer has none
  // Reused across rounds; the pump of the current upload reads it (never while it changes:
  // the old pump is dropped before the next encode).
  std::shared_ptr<compress::EncodedUpdate> encoded = std::make_shared<compress::EncodedUpdate>();
  std::vector<float> global;
  std::vector<float> delta;

  bool finished = false;
  bool stopped = false;
  Status error;
  int rounds = 0;
  int connections = 0;
  int declined = 0;
  int lost = 0;  // rounds lost to the trainer (LocalTrainer::round_failures_recoverable)
  Status last_loss;
  uint64_t peak_rss = 0;
  // Set when we leave on purpose (condition or memory): on_close waits condition_poll.
  bool away = false;
  std::string last_refusal;
  ClientState state;
  // The upload in flight: saved in `state` once the aggregator acknowledges all of it.
  std::string upload_spec;
  uint64_t upload_round = 0;
  // Round timing (EdgeClient::round_times): plan arrival, and the training of the upload in
  // flight.
  std::chrono::steady_clock::time_point plan_at{};
  double upload_train_seconds = 0.0;
  EdgeClient::RoundTimes times;
  // Secure aggregation (docs/secagg.md): the round's client session, the encoding the
  // aggregator asked for, the neighbours' sealed shares (stage 2), and the error-feedback
  // residual kept across rounds.
  std::unique_ptr<secagg::ClientSession> sa;
  v1::SecAggEncoding sa_encoding;
  std::optional<v1::SecAggCiphertexts> sa_ciphertexts;
  std::vector<float> sa_residual;
  int sa_refusals = 0;

  // Restores the state file, if any. False (and stopped) when it cannot be used.
  bool load_state() {
    state.node_id = options.node_id;
    if (options.state_path.empty()) return true;
    auto r = load_client_state(options.state_path, options.node_id);
    if (r.status().code() == StatusCode::kNotFound) return true;
    if (!r.ok()) {
      fail(r.status().with_context("client " + options.node_id +
                                   " (move the state file away to start afresh)"));
      return false;
    }
    state = std::move(*r);
    rounds = static_cast<int>(state.rounds_trained);
    if (auto it = state.codec_state.find(std::string(kSecAggStateKey));
        it != state.codec_state.end()) {
      sa_residual = it->second;
    }
    spdlog::info("client {}: resumed from {} ({} rounds trained, last round {})", options.node_id,
                 options.state_path, state.rounds_trained, state.last_round);
    return true;
  }

  void save_state() {
    if (!sa_residual.empty()) state.codec_state[std::string(kSecAggStateKey)] = sa_residual;
    state.rounds_trained = static_cast<uint64_t>(rounds);
    state.last_round = upload_round;
    auto it = codecs.find(upload_spec);
    if (it != codecs.end()) {
      const auto st = it->second->persistent_state();
      if (!st.empty()) state.codec_state[upload_spec].assign(st.begin(), st.end());
    }
    auto enc = encoders.find(upload_spec);
    if (enc != encoders.end() && enc->second) {
      auto st = enc->second->persistent_state();
      if (!st.empty()) state.codec_state[upload_spec] = std::move(st);
    }
    if (options.state_path.empty()) return;
    const Status s = save_client_state(options.state_path, state);
    if (!s.ok()) spdlog::error("client {}: {}", options.node_id, s.to_string());
  }

  // Whether the training condition allows training now; logs a refusal once per reason.
  bool condition_allows() {
    if (options.condition.empty()) return true;
    std::string why;
    auto r = options.condition.allows(&why);
    if (!r.ok()) {
      fail(r.status().with_context("client " + options.node_id + ": training condition"));
      return false;
    }
    if (*r) {
      if (!last_refusal.empty()) spdlog::info("client {}: may train again", options.node_id);
      last_refusal.clear();
      return true;
    }
    if (why != last_refusal) {
      spdlog::info("client {}: not training now: {}", options.node_id, why);
      last_refusal = why;
    }
    return false;
  }

  void wait_then_connect(std::chrono::milliseconds delay) {
    retry_timer.expires_after(delay);
    retry_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (!ec && self) self->connect();
    });
  }

  // The round trains on this thread, so neither heartbeats nor the aggregator's frames are
  // read meanwhile: until the round's deadline (and a minute more) the aggregator's silence is
  // no sign that it is gone.
  void quiet_until_round_deadline() {
    const uint64_t now_ms = net::unix_now_ms();
    const auto left = std::chrono::milliseconds(
        plan->deadline_unix_ms() > now_ms ? plan->deadline_unix_ms() - now_ms : 0);
    conn->set_idle_deadline(
        std::max(options.connect.connection.deadlines.idle, left + std::chrono::minutes(1)));
  }

  // Heartbeats on the current connection, every heartbeat_interval until it closes.
  void schedule_heartbeat() {
    if (options.heartbeat_interval.count() <= 0) return;
    heartbeat_timer.expires_after(options.heartbeat_interval);
    heartbeat_timer.async_wait([weak = weak_from_this(), c = conn](const asio::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->stopped || self->conn != c || !c->is_open()) return;
      (void)c->send(net::make_heartbeat());  // a full send queue is traffic enough
      self->schedule_heartbeat();
    });
  }

  // Leaves the federation for condition_poll: the aggregator treats it as a dropped client.
  void decline(const std::string& why) {
    ++declined;
    away = true;
    spdlog::warn("client {}: declining round {}: {}", options.node_id,
                 plan ? plan->round() : uint64_t{0}, why);
    if (conn) conn->close();
  }

  // The trainer failed this round only: say so to the aggregator (its metrics count it), leave
  // the round and come back for the next one after the usual backoff.
  void lose_round(const v1::RoundPlan& p, const Status& st) {
    ++lost;
    last_loss = st;
    const std::string why = "round " + std::to_string(p.round()) + " lost: " + st.to_string();
    spdlog::warn("client {}: {}", options.node_id, why);
    std::vector<float>().swap(global);
    std::vector<float>().swap(delta);
    if (!conn) return;
    v1::Envelope e;
    e.mutable_error()->set_code(v1::ERROR_CODE_INTERNAL);
    e.mutable_error()->set_message(why);
    e.mutable_error()->set_retryable(true);
    (void)conn->send(e);
    conn->close();
  }

  void connect() {
    if (stopped) return;
    if (!condition_allows()) {
      if (!stopped) wait_then_connect(options.condition_poll);
      return;
    }
    auto weak = weak_from_this();
    net::connect_with_retry(io, ctx, options.connect, options.backoff,
                            Rng(options.seed).fork(2 + static_cast<uint64_t>(connections)),
                            [weak](Result<std::shared_ptr<net::Connection>> r) {
                              if (auto self = weak.lock()) self->on_connected(std::move(r));
                            });
  }

  void on_connected(Result<std::shared_ptr<net::Connection>> r) {
    if (stopped) {
      if (r.ok()) (*r)->abort(Status(StatusCode::kCancelled, "client stopped"));
      return;
    }
    if (!r.ok()) return fail(r.status().with_context("client " + options.node_id));
    conn = std::move(*r);
    ++connections;
    server_hello = false;
    auto weak = weak_from_this();
    auto c = conn;
    c->start(
        [weak, c](v1::Envelope e) {
          auto self = weak.lock();
          if (self && self->conn == c) self->on_message(std::move(e));
        },
        [weak, c](const Status& st) {
          auto self = weak.lock();
          if (self && self->conn == c) self->on_close(st);
        });
    v1::Envelope hello;
    *hello.mutable_hello() = net::make_hello(
        options.node_id, options.role,
        {"identity", "fp16", "bf16", "int8", "qsgd", "topk", "randk", "powersgd", "sign"},
        wire::kDefaultMaxFrameBytes);
    (void)conn->send(hello);
    schedule_heartbeat();
  }

  void fail(const Status& st) {
    error = st;
    stopped = true;
    spdlog::error("client {}: {}", options.node_id, st.to_string());
    if (conn) conn->abort(st);
  }

  void on_close(const Status& st) {
    conn.reset();
    heartbeat_timer.cancel();
    sa.reset();  // the aggregator lost us for this round: its session ends with the connection
    sa_ciphertexts.reset();
    rx.reset();
    plan.reset();
    if (pump) pump->cancel();
    pump.reset();
    if (stopped || finished) return;
    if (away) {
      away = false;
      return wait_then_connect(options.condition_poll);
    }
    const auto delay = backoff.next();
    spdlog::info("client {}: connection lost ({}); reconnecting in {} ms", options.node_id,
                 st.to_string(), delay.count());
    wait_then_connect(delay);
  }

  void on_message(v1::Envelope e) {
    switch (e.body_case()) {
      case v1::Envelope::kHello: {
        const Status st = net::check_hello(e.hello(), conn->peer());
        if (!st.ok() || e.hello().role() != v1::ROLE_AGGREGATOR) {
          return fail(st.ok() ? permission_denied("peer is not an aggregator") : st);
        }
        server_hello = true;
        // Only an aggregator that took us resets the backoff: one that refuses us at the
        // Hello (allow-list, revocation, a leaf it cannot take) is retried ever more slowly.
        backoff.reset();
        return;
      }
      case v1::Envelope::kRoundPlan:
        if (!server_hello) return fail(failed_precondition("round plan before Hello"));
        plan = e.round_plan();
        plan_at = std::chrono::steady_clock::now();
        quiet_until_round_deadline();
        rx.reset();
        sa.reset();
        sa_ciphertexts.reset();
        if (options.require_secure_aggregation && !plan->secure_aggregation()) {
          return fail(permission_denied(
              "round " + std::to_string(plan->round()) +
              ": the aggregator asks for the update in the clear, and this client takes part "
              "only in secure aggregation ([secagg] enabled in its config)"));
        }
        if (!condition_allows() && !stopped) decline(last_refusal);
        return;
      case v1::Envelope::kModelDownload:
        return on_download(e.model_download());
      case v1::Envelope::kChunk:
        return on_chunk(e.chunk());
      case v1::Envelope::kChunkAck:
        if (pump && e.chunk_ack().transfer_id() == pump->header().transfer_id()) {
          if (e.chunk_ack().complete()) {
            const double total =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - plan_at).count();
            ++times.rounds;
            times.total_seconds += total;
            times.train_seconds += upload_train_seconds;
            spdlog::debug("client {}: round {}: {:.3f} s, {:.3f} s training ({:.1f}% outside)",
                          options.node_id, upload_round, total, upload_train_seconds,
                          total > 0 ? 100.0 * (total - upload_train_seconds) / total : 0.0);
            save_state();
            conn->set_idle_deadline(options.connect.connection.deadlines.idle);
          } else if (!pump->started()) {
            pump->start();  // the aggregator's turn for this upload (an ack from index 0)
          } else {
            pump->resume_from(e.chunk_ack().next_index());
          }
        }
        return;
      case v1::Envelope::kError:
        return on_error(e.error());
      case v1::Envelope::kSecagg:
        return on_secagg(e.secagg());
      default:
        return;
    }
  }

  void send_secagg(v1::SecAggMessage m) {
    v1::Envelope e;
    *e.mutable_secagg() = std::move(m);
    (void)conn->send(e);
  }

  // An honest client's refusal (core/secagg/protocol.h): it leaves the round's protocol.
  void refuse_secagg(const Status& why) {
    ++sa_refusals;
    spdlog::warn("client {}: secure aggregation: refused: {}", options.node_id, why.to_string());
    sa.reset();
    sa_ciphertexts.reset();
  }

  void on_secagg(const v1::SecAggMessage& m) {
    switch (m.stage_case()) {
      case v1::SecAggMessage::kSetup: {
        if (!plan || !plan->secure_aggregation() || m.setup().round() != plan->round()) {
          return refuse_secagg(failed_precondition("a setup without a matching round plan"));
        }
        auto session = secagg::ClientSession::create(plan->round(), m.setup());
        if (!session.ok()) return refuse_secagg(session.status());
        sa = std::move(*session);
        sa_encoding = m.setup().encoding();
        sa_ciphertexts.reset();
        v1::SecAggMessage out;
        *out.mutable_advertise() = sa->advertise();
        return send_secagg(std::move(out));
      }
      case v1::SecAggMessage::kKeys: {
        if (!sa) return;
        auto shares = sa->share_keys(m.keys());
        if (!shares.ok()) return refuse_secagg(shares.status());
        v1::SecAggMessage out;
        *out.mutable_share_keys() = std::move(*shares);
        return send_secagg(std::move(out));
      }
      case v1::SecAggMessage::kCiphertexts:
        if (sa) sa_ciphertexts = m.ciphertexts();
        return;
      case v1::SecAggMessage::kUnmaskRequest: {
        if (!sa) return;
        auto shares = sa->unmask(m.unmask_request());
        if (!shares.ok()) return refuse_secagg(shares.status());
        v1::SecAggMessage out;
        *out.mutable_unmask_shares() = std::move(*shares);
        sa.reset();  // done with the round: its keys and seed go
        return send_secagg(std::move(out));
      }
      default:
        spdlog::warn("client {}: unexpected secure aggregation message", options.node_id);
    }
  }

  // The masked vector of a secure round (docs/secagg.md): the update clipped, quantized on the
  // round's coordinates with error feedback, noised (distributed DP) and masked; serialized
  // for the upload. The update itself never leaves the client.
  Result<std::string> masked_update(const v1::RoundPlan& p) {
    if (!sa || !sa_ciphertexts) {
      return failed_precondition("round " + std::to_string(p.round()) +
                                 " runs secure aggregation and this client holds no session "
                                 "for it (it refused or missed the key stages)");
    }
    Rng rng = Rng(options.seed).fork(5).fork(p.seed());
    std::vector<uint32_t> quantized;
    RETURN_IF_ERROR(
        secagg::encode_update(sa_encoding, sa->params(), delta, sa_residual, rng, quantized),
        "secure aggregation of round " + std::to_string(p.round()));
    ASSIGN_OR_RETURN(auto masked, sa->masked_input(*sa_ciphertexts, quantized),
                     "secure aggregation of round " + std::to_string(p.round()));
    sa_ciphertexts.reset();
    return masked.SerializeAsString();
  }

  void on_error(const v1::Error& err) {
    if (err.message() == kFederationComplete) {
      finished = true;
      stopped = true;
      spdlog::info("client {}: federation complete after {} rounds", options.node_id, rounds);
      if (conn) conn->close();
      return;
    }
    spdlog::warn("client {}: aggregator says: {} ({})", options.node_id, err.message(),
                 v1::ErrorCode_Name(err.code()));
  }

  void on_download(const v1::ModelDownload& d) {
    if (!plan || d.round() != plan->round() || d.is_delta()) {
      spdlog::warn("client {}: model download without a matching plan", options.node_id);
      return;
    }
    if (d.transfer().total_bytes() != static_cast<uint64_t>(numel) * 4) {
      return fail(failed_precondition("the aggregator's model has " +
                                      std::to_string(d.transfer().total_bytes() / 4) +
                                      " parameters, ours " + std::to_string(numel)));
    }
    // The model digest is computed on a helper thread while chunks keep arriving.
    auto r = net::ChunkReceiver::create_buffered(d.transfer(), static_cast<uint64_t>(numel) * 4,
                                                 net::ChunkReceiver::Hashing::kBackground);
    if (!r.ok()) return fail(r.status());
    rx.emplace(std::move(*r));
    rx_transfer = d.transfer().transfer_id();
    if (rx->all_received()) finish_download();
  }

  void on_chunk(const v1::Chunk& c) {
    if (!rx || c.transfer_id() != rx_transfer) return;
    const Status st = rx->accept(c);
    if (st.code() == StatusCode::kDataLoss) {
      v1::Envelope ack;
      *ack.mutable_chunk_ack() = rx->ack();
      (void)conn->send(ack);
      return;
    }
    if (!st.ok()) return fail(st);
    if (rx->all_received()) finish_download();
  }

  Result<compress::Codec*> codec_for(const std::string& spec) {
    auto it = codecs.find(spec);
    if (it != codecs.end()) return it->second.get();
    ASSIGN_OR_RETURN(auto codec, compress::make_codec(spec, trainer.layout(),
                                                      Rng(options.seed).fork(3).next_u64()));
    auto saved = state.codec_state.find(spec);
    if (saved != state.codec_state.end()) {
      RETURN_IF_ERROR(codec->restore_state(saved->second),
                      "restoring codec '" + spec + "' from " + options.state_path);
    }
    return codecs.emplace(spec, std::move(codec)).first->second.get();
  }

  // The trainer's encoder of `spec` (made once, its saved state restored), or null: encode on
  // the host.
  Result<UpdateEncoder*> encoder_for(const std::string& spec) {
    auto it = encoders.find(spec);
    if (it != encoders.end()) return it->second.get();
    ASSIGN_OR_RETURN(auto enc, trainer.make_encoder(spec, Rng(options.seed).fork(3).next_u64()),
                     "the trainer's encoder of codec '" + spec + "'");
    if (enc) {
      auto saved = state.codec_state.find(spec);
      if (saved != state.codec_state.end()) {
        RETURN_IF_ERROR(enc->restore_state(saved->second),
                        "restoring codec '" + spec + "' from " + options.state_path);
      }
    }
    return encoders.emplace(spec, std::move(enc)).first->second.get();
  }

  void finish_download() {
    Status st = rx->finish();
    if (!st.ok()) {
      // The digest cannot say which chunk was wrong: reconnect and take the next round.
      spdlog::warn("client {}: model download corrupt: {}", options.node_id, st.to_string());
      rx.reset();
      return conn->abort(st);
    }
    const std::string payload = rx->take_payload();
    rx.reset();
    global.resize(static_cast<size_t>(numel));
    st = from_f32_bytes(payload, global);
    if (!st.ok()) return fail(st);
    const v1::RoundPlan p = *plan;
    // A secure round masks the update on the host; otherwise the trainer may encode it where it
    // lives (then it gets no host delta).
    UpdateEncoder* encoder = nullptr;
    if (!p.secure_aggregation()) {
      auto e = encoder_for(p.codec());
      if (!e.ok()) return fail(e.status());
      encoder = *e;
    }
    if (encoder) {
      std::vector<float>().swap(delta);
    } else {
      delta.assign(static_cast<size_t>(numel), 0.0f);
    }
    if (options.memory_limit_bytes > 0) {
      // Beyond the trainer's working set: the codec's residual and encoding buffers.
      const uint64_t extra = trainer.working_set_bytes(p) +
                             (codecs.count(p.codec()) ? 1u : 3u) * static_cast<uint64_t>(numel) * 4;
      const Status mem = MemoryBudget{options.memory_limit_bytes}.check(
          extra, "round " + std::to_string(p.round()) + "'s training");
      if (!mem.ok()) return decline(mem.message());
    }
    const auto train_start = std::chrono::steady_clock::now();
    auto report = trainer.train(global, p, encoder ? std::span<float>() : std::span<float>(delta));
    upload_train_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
    if (!report.ok()) {
      if (trainer.round_failures_recoverable()) return lose_round(p, report.status());
      return fail(report.status().with_context("local training"));
    }
    if (auto pk = edge_client::peak_rss_bytes(); pk.ok()) peak_rss = *pk;
    if (!conn) return;  // the connection dropped while training
    if (pump) pump->cancel();
    pump.reset();
    std::shared_ptr<const std::string> masked;
    if (p.secure_aggregation()) {
      auto bytes = masked_update(p);
      if (!bytes.ok()) {
        std::vector<float>().swap(global);
        std::vector<float>().swap(delta);
        return refuse_secagg(bytes.status());
      }
      masked = std::make_shared<const std::string>(std::move(*bytes));
    } else {
      if (encoded.use_count() > 1) encoded = std::make_shared<compress::EncodedUpdate>();
      if (encoder) {
        st = encoder->encode_into(*encoded);
      } else {
        auto codec = codec_for(p.codec());
        if (!codec.ok()) return fail(codec.status());
        st = (*codec)->encode_into(delta, *encoded);
      }
      if (!st.ok()) return fail(st.with_context("encoding the update"));
    }
    // Idle until the next plan: the model-sized buffers go back (a simulation holds hundreds of
    // clients in one process; a device gets its memory back between rounds).
    std::vector<float>().swap(global);
    std::vector<float>().swap(delta);
    ++rounds;
    // Read out as an update stream: no serialized copy, and no size ceiling.
    if (masked) {
      pump = std::make_shared<ChunkPump>(conn, masked, next_transfer++, options.chunk_bytes,
                                         std::string(kSecAggMaskedContentType));
    } else {
      pump = std::make_shared<ChunkPump>(conn, std::make_shared<UpdateStreamSource>(encoded),
                                         next_transfer++, options.chunk_bytes,
                                         std::string(kUpdateStreamContentType));
    }
    if (options.upload_bytes_per_second > 0) {
      pump->set_rate_limit(io.get_executor(), options.upload_bytes_per_second);
    }
    if (options.crash_point == "uploading@" + std::to_string(p.round())) {
      const uint64_t half = (pump->header().num_chunks() + 1) / 2;
      pump->set_on_chunk_sent([this, half](uint64_t index) {
        if (index + 1 < half) return;
        spdlog::warn("client {}: crash point {}: SIGKILL after {} chunk(s)", options.node_id,
                     options.crash_point, index + 1);
        spdlog::default_logger()->flush();
        std::raise(SIGKILL);
      });
    }
    upload_spec = p.codec();
    upload_round = p.round();
    v1::Envelope up;
    auto* u = up.mutable_update_upload();
    u->set_round(p.round());
    u->set_base_version(p.model_version());
    u->set_num_samples(report->num_samples);
    u->set_codec(masked ? std::string(kSecAggMaskedContentType) : p.codec());
    u->set_train_loss(report->loss);
    for (auto& c : trainer.take_contributions()) *u->add_contributions() = std::move(c);
    *u->mutable_transfer() = pump->header();
    // The chunks follow once the aggregator grants the upload its turn (a ChunkAck).
    (void)conn->send(up);
  }
};

EdgeClient::EdgeClient(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx,
                       EdgeClientOptions options, LocalTrainer& trainer)
    : impl_(std::make_shared<Impl>(io, std::move(ctx), std::move(options), trainer)) {}

EdgeClient::~EdgeClient() {
  impl_->stopped = true;
  impl_->retry_timer.cancel();
  impl_->heartbeat_timer.cancel();
  if (impl_->conn) impl_->conn->abort(Status(StatusCode::kCancelled, "client destroyed"));
}

void EdgeClient::start() {
  if (impl_->load_state()) impl_->connect();
}
void EdgeClient::stop() {
  impl_->stopped = true;
  impl_->retry_timer.cancel();
  impl_->heartbeat_timer.cancel();
  if (impl_->conn) impl_->conn->close();
}
bool EdgeClient::finished() const { return impl_->finished; }
bool EdgeClient::stopped() const { return impl_->stopped; }
const Status& EdgeClient::error() const { return impl_->error; }
int EdgeClient::rounds_trained() const { return impl_->rounds; }
int EdgeClient::connections() const { return impl_->connections; }
int EdgeClient::rounds_declined() const { return impl_->declined; }
EdgeClient::RoundTimes EdgeClient::round_times() const { return impl_->times; }
int EdgeClient::rounds_lost() const { return impl_->lost; }
int EdgeClient::secagg_refusals() const { return impl_->sa_refusals; }
const Status& EdgeClient::last_round_lost() const { return impl_->last_loss; }
uint64_t EdgeClient::peak_rss_bytes() const { return impl_->peak_rss; }

}  // namespace starling::edge_client
