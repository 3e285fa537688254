// The edge client's connection loop and round handling.
#include "edge_client/edge_client.h"

#include <spdlog/spdlog.h>

#include <asio/steady_timer.hpp>
#include <map>
#include <optional>

#include "core/net/chunk_stream.h"
#include "core/net/hello.h"
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
        retry_timer(io_ctx) {
    const auto n = compress::validate_layout(trainer.layout());
    numel = n.ok() ? *n : 0;
  }

  asio::io_context& io;
  std::shared_ptr<asio::ssl::context> ctx;
  EdgeClientOptions options;
  LocalTrainer& trainer;
  net::Backoff backoff;
  asio::steady_timer retry_timer;
  int64_t numel = 0;

  std::shared_ptr<net::Connection> conn;
  bool server_hello = false;
  std::optional<v1::RoundPlan> plan;
  std::optional<net::ChunkReceiver> rx;
  uint64_t rx_transfer = 0;
  std::shared_ptr<ChunkPump> pump;
  uint64_t next_transfer = 1;
  // One codec per spec string, kept across rounds (and reconnects) for error feedback.
  std::map<std::string, std::unique_ptr<compress::Codec>> codecs;
  compress::EncodedUpdate encoded;
  std::vector<float> global;
  std::vector<float> delta;

  bool finished = false;
  bool stopped = false;
  Status error;
  int rounds = 0;
  int connections = 0;

  void connect() {
    if (stopped) return;
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
    backoff.reset();
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
        options.node_id, v1::ROLE_CLIENT,
        {"identity", "fp16", "bf16", "int8", "qsgd", "topk", "randk", "powersgd", "sign"},
        wire::kDefaultMaxFrameBytes);
    (void)conn->send(hello);
  }

  void fail(const Status& st) {
    error = st;
    stopped = true;
    spdlog::error("client {}: {}", options.node_id, st.to_string());
    if (conn) conn->abort(st);
  }

  void on_close(const Status& st) {
    conn.reset();
    rx.reset();
    plan.reset();
    if (pump) pump->cancel();
    pump.reset();
    if (stopped || finished) return;
    const auto delay = backoff.next();
    spdlog::info("client {}: connection lost ({}); reconnecting in {} ms", options.node_id,
                 st.to_string(), delay.count());
    retry_timer.expires_after(delay);
    retry_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (!ec && self) self->connect();
    });
  }

  void on_message(v1::Envelope e) {
    switch (e.body_case()) {
      case v1::Envelope::kHello: {
        const Status st = net::check_hello(e.hello(), conn->peer());
        if (!st.ok() || e.hello().role() != v1::ROLE_AGGREGATOR) {
          return fail(st.ok() ? permission_denied("peer is not an aggregator") : st);
        }
        server_hello = true;
        return;
      }
      case v1::Envelope::kRoundPlan:
        if (!server_hello) return fail(failed_precondition("round plan before Hello"));
        plan = e.round_plan();
        rx.reset();
        return;
      case v1::Envelope::kModelDownload:
        return on_download(e.model_download());
      case v1::Envelope::kChunk:
        return on_chunk(e.chunk());
      case v1::Envelope::kChunkAck:
        if (pump && !e.chunk_ack().complete() &&
            e.chunk_ack().transfer_id() == pump->header().transfer_id()) {
          pump->resume_from(e.chunk_ack().next_index());
        }
        return;
      case v1::Envelope::kError:
        return on_error(e.error());
      default:
        return;
    }
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
    auto r = net::ChunkReceiver::create_buffered(d.transfer(), static_cast<uint64_t>(numel) * 4);
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
    return codecs.emplace(spec, std::move(codec)).first->second.get();
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
    delta.assign(static_cast<size_t>(numel), 0.0f);
    st = from_f32_bytes(payload, global);
    if (!st.ok()) return fail(st);
    const v1::RoundPlan p = *plan;
    auto report = trainer.train(global, p, delta);
    if (!report.ok()) return fail(report.status().with_context("local training"));
    if (!conn) return;  // the connection dropped while training
    auto codec = codec_for(p.codec());
    if (!codec.ok()) return fail(codec.status());
    st = (*codec)->encode_into(delta, encoded);
    if (!st.ok()) return fail(st.with_context("encoding the update"));
    ++rounds;
    auto bytes = std::make_shared<const std::string>(compress::serialize_update(encoded));
    if (pump) pump->cancel();
    pump = std::make_shared<ChunkPump>(conn, bytes, next_transfer++, options.chunk_bytes,
                                       std::string(kUpdateContentType));
    v1::Envelope up;
    auto* u = up.mutable_update_upload();
    u->set_round(p.round());
    u->set_base_version(p.model_version());
    u->set_num_samples(report->num_samples);
    u->set_codec(p.codec());
    u->set_train_loss(report->loss);
    *u->mutable_transfer() = pump->header();
    (void)conn->send(up);
    pump->start();
  }
};

EdgeClient::EdgeClient(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx,
                       EdgeClientOptions options, LocalTrainer& trainer)
    : impl_(std::make_shared<Impl>(io, std::move(ctx), std::move(options), trainer)) {}

EdgeClient::~EdgeClient() {
  impl_->stopped = true;
  impl_->retry_timer.cancel();
  if (impl_->conn) impl_->conn->abort(Status(StatusCode::kCancelled, "client destroyed"));
}

void EdgeClient::start() { impl_->connect(); }
void EdgeClient::stop() {
  impl_->stopped = true;
  impl_->retry_timer.cancel();
  if (impl_->conn) impl_->conn->close();
}
bool EdgeClient::finished() const { return impl_->finished; }
bool EdgeClient::stopped() const { return impl_->stopped; }
const Status& EdgeClient::error() const { return impl_->error; }
int EdgeClient::rounds_trained() const { return impl_->rounds; }
int EdgeClient::connections() const { return impl_->connections; }

}  // namespace starling::edge_client
