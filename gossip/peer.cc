// The networked peer: links (TLS connections with a transfer queue each), membership gossip,
// synchronous rounds (D-PSGD, CHOCO-SGD), push-pull exchanges and catch-up.
#include "gossip/peer.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "core/net/chunk_stream.h"
#include "core/net/client.h"
#include "core/net/hello.h"
#include "core/util/rng.h"
#include "core/wire/envelope.h"
#include "gossip/membership.h"
#include "gossip/peer_state.h"
#include "gossip/simulation.h"

namespace starling::gossip {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kCodecs = {"identity", "fp16",  "bf16",     "int8", "qsgd",
                                          "topk",     "randk", "powersgd", "sign"};

// One queued transfer: the GossipExchange announcing it and its payload (none: no transfer).
struct OutItem {
  v1::Envelope header;
  std::shared_ptr<const std::string> payload;
};

// A connection to one peer with an ordered queue of outgoing transfers (one streams at a time,
// as fast as the connection's send queue allows) and the state of the incoming one.
struct Link {
  std::shared_ptr<net::Connection> conn;
  std::string peer_id;      // from the certificate, once its Hello checked out
  std::string expected_id;  // when we dialed a known member
  bool dialed_by_me = false;
  bool registered = false;
  // CHOCO: the version of our public copy the other side holds (increments sent so far).
  uint64_t synced_version = 0;
  std::deque<OutItem> out;
  std::optional<net::ChunkSender> sender;
  uint64_t next_chunk = 0;
  uint64_t next_transfer = 1;
  std::optional<v1::GossipExchange> rx_meta;
  std::optional<net::ChunkReceiver> rx;

  std::string dialer(const std::string& self) const { return dialed_by_me ? self : peer_id; }
};

struct PendingChoco {
  uint64_t round = 0;
  bool snapshot = false;
  uint64_t version = 0;
  std::optional<compress::EncodedUpdate> update;  // none: a zero snapshot
};

struct Received {
  compress::EncodedUpdate update;
  uint32_t degree = 0;
};

// D-PSGD: a recent round, kept for neighbours' messages that arrive after we mixed without them
// (a link replaced mid-round lost them; we saw the neighbour a round ahead): our message of that
// round, resent on a new link, and what we mixed it against.
struct PastRound {
  std::shared_ptr<const std::string> msg;
  uint32_t degree = 0;
  std::vector<std::string> sent_to;
  std::map<std::string, double> missed;  // expected sender -> weight (< 0: Metropolis-Hastings)
  std::vector<float> own;                // our model as mixed; kept while `missed` is not empty
};

// Rounds of PastRound kept: a message later than this is not mixed.
constexpr uint64_t kPastRounds = 4;

// kResuming: restarted from a saved state, waiting (up to the failure timeout) for the members
// it last saw, so that its first round is laid over the same topology as before the crash.
enum class Phase { kJoining, kResuming, kWaiting, kExchanging, kPushWait, kLinger, kDone };

std::string host_of(const std::string& address) { return address.substr(0, address.rfind(':')); }
uint16_t port_of(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return 0;
  try {
    const int p = std::stoi(address.substr(colon + 1));
    return p > 0 && p < 65536 ? static_cast<uint16_t>(p) : 0;
  } catch (...) {
    return 0;
  }
}

}  // namespace

struct Peer::Impl : std::enable_shared_from_this<Peer::Impl> {
  Impl(asio::io_context& io_ctx, std::shared_ptr<asio::ssl::context> s,
       std::shared_ptr<asio::ssl::context> c, PeerOptions o, compress::Layout l,
       edge_client::LocalTrainer* t, RoundHook h)
      : io(io_ctx),
        server_ctx(std::move(s)),
        client_ctx(std::move(c)),
        options(std::move(o)),
        layout(std::move(l)),
        trainer(t),
        hook(std::move(h)),
        heartbeat_timer(io_ctx),
        phase_timer(io_ctx),
        rng(Rng(options.seed).fork(std::hash<std::string>{}(options.node_id))) {}

  asio::io_context& io;
  std::shared_ptr<asio::ssl::context> server_ctx;
  std::shared_ptr<asio::ssl::context> client_ctx;
  PeerOptions options;
  compress::Layout layout;
  int64_t numel = 0;
  edge_client::LocalTrainer* trainer;
  RoundHook hook;
  std::unique_ptr<GossipNode> node;
  std::unique_ptr<net::Server> server;
  std::unique_ptr<Membership> membership;
  std::string self_address;  // host:port we advertise
  asio::steady_timer heartbeat_timer;
  asio::steady_timer phase_timer;
  Rng rng;

  std::map<std::string, std::shared_ptr<Link>> links;  // registered, by peer id
  std::set<std::shared_ptr<Link>> pending;             // awaiting Hello
  std::set<std::string> dialing;
  int seed_dials = 0;         // seed connections in progress
  std::string catch_up_from;  // where our catch-up request went

  Phase phase = Phase::kWaiting;
  uint64_t round = 0;  // the round being run (rounds completed before it)
  Clock::time_point deadline{};
  Clock::time_point round_started{};
  double round_loss = 0.0;
  bool caught_up = false;
  bool catch_up_requested = false;
  // Resuming from a saved state.
  uint64_t resumed_at = 0;
  bool resumed = false;  // the next round report says so
  bool has_saved_state = false;
  std::vector<std::pair<std::string, std::string>> saved_members;  // id, address
  Clock::time_point resume_deadline{};
  // Crash injection (PeerOptions::crash_point).
  std::string crash_stage;
  uint64_t crash_round = 0;
  asio::steady_timer crash_timer{io};
  // Synchronous rounds.
  std::map<std::string, double> expected;  // sender -> fixed weight, or < 0 for Metropolis
  size_t my_degree = 0;
  std::shared_ptr<const std::string> current_msg;
  uint64_t messages_made = 0;  // CHOCO: the version of our public copy
  std::map<uint64_t, std::map<std::string, Received>> inbox;
  std::map<std::string, uint64_t> latest_round_from;
  std::map<std::string, uint64_t> copy_version;  // CHOCO: version of each neighbour's copy
  std::map<std::string, std::deque<PendingChoco>> choco_pending;
  std::map<uint64_t, PastRound> past;  // D-PSGD
  // Push-pull.
  std::string push_partner;
  std::vector<float> delta;
  uint64_t bytes = 0;
  Status error;
  bool stopped = false;

  // ---- links ----

  void setup(std::shared_ptr<net::Connection> conn, bool dialed, std::string expected_id) {
    auto link = std::make_shared<Link>();
    link->conn = conn;
    link->dialed_by_me = dialed;
    link->expected_id = std::move(expected_id);
    pending.insert(link);
    std::weak_ptr<Impl> weak = weak_from_this();
    conn->start(
        [weak, link](v1::Envelope e) {
          if (auto self = weak.lock()) self->on_message(link, std::move(e));
        },
        [weak, link](const Status& st) {
          if (auto self = weak.lock()) self->on_close(link, st);
        });
    conn->set_drain_handler([weak, wl = std::weak_ptr<Link>(link)] {
      auto self = weak.lock();
      auto l = wl.lock();
      if (self && l) self->pump(*l);
    });
    v1::Envelope hello;
    *hello.mutable_hello() =
        net::make_hello(options.node_id, v1::ROLE_PEER, kCodecs, wire::kDefaultMaxFrameBytes);
    (void)conn->send(hello);
  }

  void dial(const std::string& address, const std::string& id, const std::string& server_name) {
    if (!id.empty()) {
      if (dialing.count(id)) return;
      dialing.insert(id);
    } else {
      ++seed_dials;
    }
    net::ClientOptions co;
    co.host = host_of(address);
    co.port = port_of(address);
    co.server_name = server_name;
    std::weak_ptr<Impl> weak = weak_from_this();
    net::connect(io, client_ctx, co,
                 [weak, id, address](Result<std::shared_ptr<net::Connection>> r) {
                   auto self = weak.lock();
                   if (!self) return;
                   if (!id.empty()) {
                     self->dialing.erase(id);
                   } else {
                     --self->seed_dials;
                   }
                   if (self->stopped) {
                     if (r.ok()) (*r)->close();
                     return;
                   }
                   if (!r.ok()) {
                     spdlog::debug("peer {}: dial {} ({}): {}", self->options.node_id, address,
                                   id.empty() ? "seed" : id, r.status().to_string());
                     return;
                   }
                   self->setup(std::move(*r), true, id);
                 });
  }

  void on_close(const std::shared_ptr<Link>& link, const Status& st) {
    pending.erase(link);
    if (stopped) return;
    if (!link->registered) return;
    auto it = links.find(link->peer_id);
    if (it != links.end() && it->second == link) {
      links.erase(it);
      spdlog::debug("peer {}: link to {} closed: {}", options.node_id, link->peer_id,
                    st.to_string());
      copy_version.erase(link->peer_id);
      choco_pending.erase(link->peer_id);
      node->forget(link->peer_id);
      if (phase == Phase::kJoining && catch_up_from == link->peer_id) {
        catch_up_requested = false;  // ask the next link
        for (auto& [id, other] : links) {
          request_catch_up(*other);
          break;
        }
      }
      check_round();
    }
  }

  void drop(const std::shared_ptr<Link>& link, const Status& why) {
    spdlog::warn("peer {}: dropping link to {}: {}", options.node_id, link->conn->peer().describe(),
                 why.to_string());
    v1::Envelope e;
    e.mutable_error()->set_code(v1::ERROR_CODE_BAD_REQUEST);
    e.mutable_error()->set_message(why.message());
    (void)link->conn->send(e);
    link->conn->close();
  }

  void on_hello(const std::shared_ptr<Link>& link, const v1::Hello& hello) {
    if (link->registered) return drop(link, failed_precondition("second Hello"));
    const auto& peer = link->conn->peer();
    Status st = net::check_hello(hello, peer);
    if (st.ok() && hello.role() != v1::ROLE_PEER) {
      st = permission_denied("peer " + peer.describe() + " is not a gossip peer");
    }
    if (st.ok() && peer.node_id == options.node_id) st = failed_precondition("dialed ourselves");
    if (st.ok() && !link->expected_id.empty() && peer.node_id != link->expected_id) {
      st = permission_denied("dialed member '" + link->expected_id + "' but reached '" +
                             peer.node_id + "'");
    }
    if (!st.ok()) {
      pending.erase(link);
      if (st.code() == StatusCode::kFailedPrecondition) {
        link->conn->close();
        return;
      }
      return drop(link, st);
    }
    pending.erase(link);
    link->peer_id = peer.node_id;
    link->registered = true;
    auto it = links.find(link->peer_id);
    if (it != links.end()) {
      auto old = it->second;
      // Two connections between one pair: keep the one the lower id dialed (both sides agree);
      // a new connection from the same dialer replaces the old one (the peer restarted).
      const std::string lower = std::min(options.node_id, link->peer_id);
      const bool keep_new = link->dialer(options.node_id) == old->dialer(options.node_id) ||
                            link->dialer(options.node_id) == lower;
      if (!keep_new) {
        link->registered = false;
        link->conn->close();
        return;
      }
      old->registered = false;
      old->conn->close();
    }
    links[link->peer_id] = link;
    // A new connection: the other side starts from a zero copy of ours, and we of theirs.
    copy_version[link->peer_id] = 0;
    choco_pending.erase(link->peer_id);
    node->forget(link->peer_id);
    if (node->options().algorithm == Algorithm::kChoco) node->assume_initial_copy(link->peer_id);
    link->synced_version = 0;
    spdlog::debug("peer {}: linked with {} ({})", options.node_id, link->peer_id,
                  link->conn->peer().address);
    send_membership(*link);
    request_catch_up(*link);
    // Our recent rounds' messages may have been lost with the connection this one replaces; the
    // other side mixes only those it went without.
    for (const auto& [r, p] : past) {
      if (std::find(p.sent_to.begin(), p.sent_to.end(), link->peer_id) == p.sent_to.end()) {
        continue;
      }
      v1::Envelope e;
      auto* g = e.mutable_gossip_exchange();
      g->set_kind(v1::GOSSIP_ROUND);
      g->set_round(r);
      g->set_degree(p.degree);
      g->set_codec(node->options().codec);
      enqueue(*link, std::move(e), p.msg);
    }
    if (phase == Phase::kExchanging && current_msg) {
      const auto sends = send_targets();
      if (std::find(sends.begin(), sends.end(), link->peer_id) != sends.end()) {
        send_round(*link);
      }
    }
  }

  void request_catch_up(Link& link) {
    if (phase != Phase::kJoining || catch_up_requested) return;
    catch_up_requested = true;
    catch_up_from = link.peer_id;
    v1::Envelope e;
    e.mutable_gossip_exchange()->set_kind(v1::GOSSIP_CATCH_UP_REQUEST);
    enqueue(link, std::move(e), nullptr);
  }

  void enqueue(Link& link, v1::Envelope header, std::shared_ptr<const std::string> payload) {
    link.out.push_back({std::move(header), std::move(payload)});
    if (!link.sender) start_next(link);
  }

  void start_next(Link& link) {
    while (!link.sender && !link.out.empty()) {
      OutItem& item = link.out.front();
      if (!item.payload) {
        (void)link.conn->send(item.header);
        link.out.pop_front();
        continue;
      }
      link.sender.emplace(link.next_transfer++, *item.payload, options.chunk_bytes,
                          "encoded_update");
      link.next_chunk = 0;
      *item.header.mutable_gossip_exchange()->mutable_transfer() = link.sender->header();
      bytes += item.payload->size();
      (void)link.conn->send(item.header);
    }
    pump(link);
  }

  void pump(Link& link) {
    if (!link.sender || !link.conn->is_open()) return;
    while (link.next_chunk < link.sender->num_chunks() && link.conn->queued_bytes() < (8u << 20)) {
      auto chunk = link.sender->chunk(link.next_chunk);
      if (!chunk.ok()) return;
      v1::Envelope e;
      *e.mutable_chunk() = std::move(*chunk);
      const Status st = link.conn->send(e);
      if (!st.ok()) return;  // full (the drain handler resumes) or closing
      ++link.next_chunk;
    }
    if (link.next_chunk >= link.sender->num_chunks()) {
      link.sender.reset();
      link.out.pop_front();
      start_next(link);
    }
  }

  void send_membership(Link& link) {
    v1::Envelope e;
    *e.mutable_gossip_membership() = membership->view();
    (void)link.conn->send(e);
  }

  // ---- messages ----

  void on_message(const std::shared_ptr<Link>& link, v1::Envelope e) {
    if (stopped) return;
    if (e.body_case() == v1::Envelope::kHello) return on_hello(link, e.hello());
    if (!link->registered) {
      if (e.body_case() == v1::Envelope::kError) return;
      return drop(link, failed_precondition(std::string(wire::body_name(e)) + " before Hello"));
    }
    switch (e.body_case()) {
      case v1::Envelope::kGossipMembership: {
        const auto joined = membership->merge(e.gossip_membership(), Clock::now());
        for (const auto& id : joined) spdlog::info("peer {}: {} joined", options.node_id, id);
        if (!joined.empty()) {
          ensure_links();
          maybe_begin();
        }
        return check_round();
      }
      case v1::Envelope::kGossipExchange: {
        const auto& g = e.gossip_exchange();
        if (link->rx) return drop(link, failed_precondition("gossip exchange inside a transfer"));
        if (!g.has_transfer()) return on_exchange(*link, g, std::nullopt);
        // Our messages are at most one encoded model (a dense one is 4 bytes an element).
        const uint64_t limit = static_cast<uint64_t>(numel) * 8 + (1u << 20);
        // A large model hashes on a helper thread (in place), so that transfers from several
        // neighbours at once hash on several cores rather than on this I/O thread.
        const auto hashing =
            g.transfer().total_bytes() >= net::ChunkReceiver::kBackgroundHashMinBytes
                ? net::ChunkReceiver::Hashing::kBackground
                : net::ChunkReceiver::Hashing::kInline;
        auto rx = net::ChunkReceiver::create_buffered(g.transfer(), limit, hashing);
        if (!rx.ok()) return drop(link, rx.status());
        link->rx.emplace(std::move(*rx));
        link->rx_meta = g;
        if (link->rx->all_received()) finish_transfer(link);
        return;
      }
      case v1::Envelope::kChunk: {
        if (!link->rx || e.chunk().transfer_id() != link->rx_meta->transfer().transfer_id()) {
          return drop(link, failed_precondition("chunk of no announced transfer"));
        }
        const Status st = link->rx->accept(e.chunk());
        if (st.code() == StatusCode::kDataLoss) {
          v1::Envelope ack;
          *ack.mutable_chunk_ack() = link->rx->ack();
          (void)link->conn->send(ack);
          return;
        }
        if (!st.ok()) return drop(link, st);
        if (link->rx->all_received()) finish_transfer(link);
        return;
      }
      case v1::Envelope::kChunkAck:
        if (link->sender && !e.chunk_ack().complete() &&
            e.chunk_ack().transfer_id() == link->sender->header().transfer_id() &&
            e.chunk_ack().next_index() < link->next_chunk) {
          link->next_chunk = e.chunk_ack().next_index();
          pump(*link);
        }
        return;
      case v1::Envelope::kError:
        spdlog::warn("peer {}: {} says: {}", options.node_id, link->peer_id, e.error().message());
        return;
      default:
        return;
    }
  }

  void finish_transfer(const std::shared_ptr<Link>& link) {
    const Status st = link->rx->finish();
    if (!st.ok()) {
      link->rx.reset();
      return drop(link, st);
    }
    std::string payload = link->rx->take_payload();
    link->rx.reset();
    const v1::GossipExchange meta = *link->rx_meta;
    link->rx_meta.reset();
    on_exchange(*link, meta, std::move(payload));
  }

  void on_exchange(Link& link, const v1::GossipExchange& g, std::optional<std::string> payload) {
    const std::string& from = link.peer_id;
    const auto needs_payload = [&]() -> Result<compress::EncodedUpdate> {
      if (!payload) return invalid_argument(v1::GossipKind_Name(g.kind()) + " without payload");
      return parse_message(*payload, numel, from);
    };
    auto self = shared_from_this();
    auto bad = [&](const Status& st) {
      for (auto& [id, l] : links) {
        if (l.get() == &link) return drop(l, st);
      }
    };
    switch (g.kind()) {
      case v1::GOSSIP_ROUND:
      case v1::GOSSIP_SNAPSHOT: {
        const bool snapshot = g.kind() == v1::GOSSIP_SNAPSHOT;
        std::optional<compress::EncodedUpdate> update;
        if (payload || !snapshot) {
          auto u = needs_payload();
          if (!u.ok()) return bad(u.status());
          update = std::move(*u);
        }
        latest_round_from[from] = std::max(latest_round_from[from], g.round());
        if (node->options().algorithm == Algorithm::kChoco) {
          // Public copies advance with every message, in order; a message of a later round
          // waits until we mix that round, so both ends of an edge mix the same versions.
          choco_pending[from].push_back(
              {g.round(), snapshot, g.model_version(), std::move(update)});
          update.reset();
          if (round > 0) drain(from, round - 1);
        }
        if (g.round() < round && update && node->options().algorithm == Algorithm::kDpsgd) {
          return mix_late(from, g.round(), *update, g.degree());
        }
        if (g.round() >= round) {
          Received r;
          if (update) r.update = std::move(*update);
          r.degree = g.degree();
          inbox[g.round()][from] = std::move(r);
        }
        return check_round();
      }
      case v1::GOSSIP_PUSH: {
        auto u = needs_payload();
        if (!u.ok()) return bad(u.status());
        auto reply = node->make_message();
        if (!reply.ok()) return fail(reply.status());
        v1::Envelope e;
        e.mutable_gossip_exchange()->set_kind(v1::GOSSIP_PULL);
        e.mutable_gossip_exchange()->set_round(round);
        enqueue(link, std::move(e), std::make_shared<const std::string>(std::move(*reply)));
        const Status st = node->pair_average(*u);
        if (!st.ok()) return fail(st);
        return;
      }
      case v1::GOSSIP_PULL: {
        auto u = needs_payload();
        if (!u.ok()) return bad(u.status());
        const Status st = node->pair_average(*u);
        if (!st.ok()) return fail(st);
        if (phase == Phase::kPushWait && from == push_partner) complete_round(1);
        return;
      }
      case v1::GOSSIP_CATCH_UP_REQUEST: {
        if (round == 0) {
          // Nothing has been trained or mixed yet: the joiner keeps its own starting model.
          v1::Envelope e;
          e.mutable_gossip_exchange()->set_kind(v1::GOSSIP_CATCH_UP);
          return enqueue(link, std::move(e), nullptr);
        }
        compress::EncodedUpdate u;
        u.numel = numel;
        for (const compress::TensorInfo& t : layout) {
          compress::Segment s;
          s.codec = compress::CodecKind::kIdentity;
          s.offset = t.offset;
          s.numel = shape_numel(t.shape);
          s.shape = t.shape;
          const auto x = node->params();
          s.f32.assign(x.begin() + t.offset, x.begin() + t.offset + s.numel);
          u.segments.push_back(std::move(s));
        }
        v1::Envelope e;
        e.mutable_gossip_exchange()->set_kind(v1::GOSSIP_CATCH_UP);
        e.mutable_gossip_exchange()->set_round(round);
        enqueue(link, std::move(e),
                std::make_shared<const std::string>(compress::serialize_update(u)));
        return;
      }
      case v1::GOSSIP_CATCH_UP: {
        if (phase != Phase::kJoining) return;
        if (!payload) {
          phase = Phase::kWaiting;  // the network has not started: keep our own model
          return maybe_begin();
        }
        auto u = needs_payload();
        if (!u.ok()) return bad(u.status());
        std::vector<float> x(static_cast<size_t>(numel));
        const Status st = compress::decode(*u, x);
        if (!st.ok()) return bad(st);
        (void)node->set_params(x);
        round = g.round();
        caught_up = true;
        spdlog::info("peer {}: caught up from {} at round {}", options.node_id, from, round);
        phase = Phase::kWaiting;
        return maybe_begin();
      }
      default:
        return bad(invalid_argument("unknown gossip kind " + std::to_string(g.kind())));
    }
  }

  // D-PSGD: `from`'s message of round r, which we mixed without it: the correction that makes our
  // model what a timely mix would have given. Anything else (a resend of a message we mixed, a
  // round no longer kept) is ignored.
  void mix_late(const std::string& from, uint64_t r, const compress::EncodedUpdate& update,
                uint32_t degree) {
    auto it = past.find(r);
    if (it == past.end()) return;
    PastRound& p = it->second;
    auto m = p.missed.find(from);
    if (m == p.missed.end()) return;
    const double w = m->second >= 0 ? m->second : mh_weight(p.degree, degree);
    const Status st = node->mix_late(update, p.own, w);
    if (!st.ok()) return fail(st.with_context("late message of round " + std::to_string(r)));
    spdlog::info("peer {}: mixed {}'s late message of round {}", options.node_id, from, r);
    p.missed.erase(m);
    if (p.missed.empty()) std::vector<float>().swap(p.own);
  }

  // CHOCO: applies the queued messages of `from` up to round `upto`, in arrival order. A message
  // that does not follow our copy's version (a lost increment) drops the copy until the sender's
  // next snapshot.
  void drain(const std::string& from, uint64_t upto) {
    auto it = choco_pending.find(from);
    if (it == choco_pending.end()) return;
    auto& q = it->second;
    while (!q.empty() && q.front().round <= upto) {
      PendingChoco m = std::move(q.front());
      q.pop_front();
      Status st;
      if (m.snapshot) {
        if (m.update) {
          st = node->absorb({from, &*m.update, 0.0, true});
        } else {
          node->assume_initial_copy(from);
        }
        if (st.ok()) copy_version[from] = m.version;
      } else if (copy_version.count(from) && copy_version[from] == m.version &&
                 node->has_copy(from)) {
        st = node->absorb({from, &*m.update, 0.0, false});
        if (st.ok()) copy_version[from] = m.version + 1;
      } else {
        spdlog::warn(
            "peer {}: increment {} from {} does not follow our copy; ignored until its "
            "next snapshot",
            options.node_id, m.version, from);
        node->forget(from);
        copy_version.erase(from);
        continue;
      }
      if (!st.ok()) {
        spdlog::warn("peer {}: {}", options.node_id, st.to_string());
        node->forget(from);
        copy_version.erase(from);
      }
    }
  }

  // ---- membership and topology ----

  // Undirected neighbours (ids) of this round over the live members.
  std::vector<std::string> neighbour_ids(uint64_t r) const {
    const auto ids = membership->live_ids();
    const auto p = std::find(ids.begin(), ids.end(), options.node_id) - ids.begin();
    if (p >= static_cast<long>(ids.size())) return {};
    auto adj = neighbours(options.topology, static_cast<int>(ids.size()), r);
    std::vector<std::string> out;
    if (!adj.ok()) return out;
    for (int q : (*adj)[static_cast<size_t>(p)]) out.push_back(ids[static_cast<size_t>(q)]);
    return out;
  }

  std::vector<std::string> send_targets_;
  std::vector<std::string> send_targets() const { return send_targets_; }

  void ensure_links() {
    for (const auto& id : neighbour_ids(round)) {
      if (links.count(id) || id < options.node_id) continue;  // the lower id dials
      // A connection still awaiting its Hello: a second one would replace it, and with it
      // whatever was already sent on it.
      const bool connecting = std::any_of(pending.begin(), pending.end(), [&](const auto& l) {
        return l->dialed_by_me && l->expected_id == id;
      });
      if (connecting) continue;
      const auto address = membership->address_of(id);
      if (address) dial(*address, id, "");
    }
  }

  void heartbeat() {
    if (stopped) return;
    membership->tick();
    for (const auto& id : membership->expire(Clock::now())) {
      spdlog::info("peer {}: {} timed out; dropped from the view", options.node_id, id);
    }
    for (auto& [id, link] : links) send_membership(*link);
    ensure_links();
    if (phase == Phase::kResuming) dial_saved_members();
    if (links.empty() && pending.empty() && seed_dials == 0 && phase != Phase::kLinger) {
      for (const auto& s : options.seeds) dial(s, "", options.seed_server_name);
    }
    maybe_begin();
    check_round();
    heartbeat_timer.expires_after(options.heartbeat);
    heartbeat_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (!ec && self) self->heartbeat();
    });
  }

  // ---- crash safety ----

  void crash_if(std::string_view stage, uint64_t round1) {
    if (crash_stage != stage || crash_round != round1) return;
    spdlog::critical("peer {}: crash point {}@{}: SIGKILL", options.node_id, stage, round1);
    spdlog::default_logger()->flush();
    ::raise(SIGKILL);
  }

  // After a completed round: model and state, atomically, before anything of the next round.
  Status save_state() {
    PeerState st;
    st.node_id = options.node_id;
    st.algorithm = std::string(algorithm_name(node->options().algorithm));
    st.codec = node->options().codec;
    st.round = round;
    st.messages_made = messages_made;
    const auto x = node->params();
    st.params.assign(x.begin(), x.end());
    const auto xhat = node->public_copy();
    st.public_copy.assign(xhat.begin(), xhat.end());
    const auto cs = node->codec_state();
    st.codec_state.assign(cs.begin(), cs.end());
    for (const auto& id : membership->live_ids()) {
      const auto address = id == options.node_id ? std::optional<std::string>(self_address)
                                                 : membership->address_of(id);
      st.members.emplace_back(id, address.value_or(""));
    }
    for (const auto& [r, p] : past) {
      SavedRound sr;
      sr.round = r;
      sr.msg = *p.msg;
      sr.degree = p.degree;
      sr.sent_to = p.sent_to;
      sr.missed = p.missed;
      sr.own = p.own;
      st.past.push_back(std::move(sr));
    }
    return save_peer_state(options.state_dir, layout, st);
  }

  void restore(PeerState st) {
    round = st.round;
    resumed_at = st.round;
    messages_made = st.messages_made;
    for (SavedRound& sr : st.past) {
      PastRound& p = past[sr.round];
      p.msg = std::make_shared<const std::string>(std::move(sr.msg));
      p.degree = sr.degree;
      p.sent_to = std::move(sr.sent_to);
      p.missed = std::move(sr.missed);
      p.own = std::move(sr.own);
    }
    saved_members = std::move(st.members);
    has_saved_state = true;
  }

  // Dials the members of the saved view we have no connection to (a restarted peer may have no
  // seed, or its seed may be the one that died).
  void dial_saved_members() {
    for (const auto& [id, address] : saved_members) {
      if (id == options.node_id || address.empty() || links.count(id) || dialing.count(id)) {
        continue;
      }
      const bool connecting = std::any_of(pending.begin(), pending.end(), [&](const auto& l) {
        return l->dialed_by_me && l->expected_id == id;
      });
      if (!connecting) dial(address, id, "");
    }
  }

  // kResuming ends when every member of the saved view is alive here again, or at the deadline.
  bool resume_ready() {
    std::vector<std::string> missing;
    for (const auto& [id, address] : saved_members) {
      if (id != options.node_id && !membership->is_alive(id)) missing.push_back(id);
    }
    if (!missing.empty() && Clock::now() < resume_deadline) return false;
    for (const auto& id : missing) {
      spdlog::warn("peer {}: resuming without {}: not seen within the failure timeout",
                   options.node_id, id);
    }
    phase = Phase::kWaiting;
    return true;
  }

  // ---- rounds ----

  void maybe_begin() {
    if (phase == Phase::kResuming && !stopped && !resume_ready()) return;
    if (phase != Phase::kWaiting || stopped) return;
    // min_peers gates the start of a network only; a running one goes on with who is left.
    if (round == 0 && membership->live_ids().size() < options.min_peers) return;
    phase = Phase::kExchanging;  // guards against re-entry until begin_round runs
    const auto start_at = round_started + options.round_interval;
    if (options.round_interval.count() > 0 && Clock::now() < start_at) {
      phase_timer.expires_at(start_at);
      phase_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
        auto self = weak.lock();
        if (!ec && self) self->begin_round();
      });
      return;
    }
    asio::post(io, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->begin_round();
    });
  }

  void begin_round() {
    if (stopped) return;
    if (round >= options.num_rounds) return finish();
    if (!options.state_dir.empty() && !has_saved_state) {
      // The first round this process runs from a model it did not restore (its own initial one,
      // or a neighbour's after a catch-up): a state from here on, so that even a crash in this
      // round restarts where it began, with the members to dial.
      const Status st = save_state();
      if (!st.ok()) return fail(st.with_context("round " + std::to_string(round)));
      has_saved_state = true;
    }
    round_started = Clock::now();
    round_loss = 0.0;
    if (trainer) {
      v1::RoundPlan plan;
      plan.set_round(round);
      plan.set_local_steps(options.local_steps);
      plan.set_batch_size(options.batch_size);
      plan.set_learning_rate(scheduled_learning_rate(
          options.learning_rate, options.final_lr_fraction, round, options.num_rounds));
      plan.set_seed(rng.fork(round).next_u64());
      delta.assign(static_cast<size_t>(numel), 0.0f);
      auto report = trainer->train(node->params(), plan, delta);
      if (!report.ok()) return fail(report.status().with_context("local training"));
      auto x = node->params();
      for (size_t k = 0; k < x.size(); ++k) x[k] += delta[k];
      round_loss = report->loss;
    }
    crash_if("trained", round + 1);
    const auto ids = membership->live_ids();
    const auto p = std::find(ids.begin(), ids.end(), options.node_id) - ids.begin();
    deadline = Clock::now() + options.round_timeout;
    if (node->options().algorithm == Algorithm::kPushPull) {
      std::vector<std::string> candidates;
      for (const auto& id : neighbour_ids(round)) {
        if (links.count(id)) candidates.push_back(id);
      }
      if (candidates.empty()) return complete_round(0);
      push_partner = candidates[static_cast<size_t>(rng.below(candidates.size()))];
      auto msg = node->make_message();
      if (!msg.ok()) return fail(msg.status());
      v1::Envelope e;
      e.mutable_gossip_exchange()->set_kind(v1::GOSSIP_PUSH);
      e.mutable_gossip_exchange()->set_round(round);
      phase = Phase::kPushWait;
      enqueue(*links[push_partner], std::move(e),
              std::make_shared<const std::string>(std::move(*msg)));
      return;
    }
    auto w = mixing_matrix(options.topology, static_cast<int>(ids.size()), round);
    if (!w.ok()) return fail(w.status());
    const bool directed =
        options.topology.kind == TopologyKind::kExponential && options.topology.time_varying;
    expected.clear();
    const MixingRow& row = w->rows[static_cast<size_t>(p)];
    for (size_t k = 0; k < row.nodes.size(); ++k) {
      if (row.nodes[k] == p) continue;
      expected[ids[static_cast<size_t>(row.nodes[k])]] = directed ? row.weights[k] : -1.0;
    }
    send_targets_.clear();
    for (int q : w->send_to[static_cast<size_t>(p)]) {
      send_targets_.push_back(ids[static_cast<size_t>(q)]);
    }
    my_degree = neighbour_ids(round).size();
    auto msg = node->make_message();
    if (!msg.ok()) return fail(msg.status());
    ++messages_made;
    current_msg = std::make_shared<const std::string>(std::move(*msg));
    phase = Phase::kExchanging;
    for (const auto& id : send_targets_) {
      auto it = links.find(id);
      if (it != links.end()) send_round(*it->second);
    }
    if (crash_stage == "sent" && crash_round == round + 1) {
      // Time for the queued bytes to leave (check_round fires first if the round completes).
      crash_timer.expires_after(Millis(100));
      crash_timer.async_wait([weak = weak_from_this(), r = round + 1](const asio::error_code& ec) {
        if (auto self = weak.lock(); self && !ec) self->crash_if("sent", r);
      });
    }
    ensure_links();
    check_round();
  }

  void send_round(Link& link) {
    v1::Envelope e;
    auto* g = e.mutable_gossip_exchange();
    g->set_round(round);
    g->set_degree(static_cast<uint32_t>(my_degree));
    g->set_codec(node->options().codec);
    if (node->options().algorithm == Algorithm::kChoco &&
        link.synced_version + 1 != messages_made) {
      // The other side's copy of us missed increments (or never had one): send all of it.
      g->set_kind(v1::GOSSIP_SNAPSHOT);
      g->set_model_version(messages_made);
      link.synced_version = messages_made;
      return enqueue(link, std::move(e), std::make_shared<const std::string>(node->snapshot()));
    }
    g->set_kind(v1::GOSSIP_ROUND);
    g->set_model_version(messages_made - 1);
    link.synced_version = messages_made;
    enqueue(link, std::move(e), current_msg);
  }

  void check_round() {
    if (phase != Phase::kExchanging || !current_msg) {
      if (phase == Phase::kPushWait && Clock::now() > deadline) {
        spdlog::warn("peer {}: no push-pull reply from {} in round {}", options.node_id,
                     push_partner, round);
        complete_round(0);
      }
      return;
    }
    const auto& got = inbox[round];
    bool all = true;
    for (const auto& [id, weight] : expected) {
      const bool have = got.count(id) > 0;
      const bool gone = !membership->is_alive(id);
      const auto lr = latest_round_from.find(id);
      const bool ahead = lr != latest_round_from.end() && lr->second > round;
      if (!have && !gone && !ahead) all = false;
    }
    if (!all && Clock::now() < deadline) return;
    if (!all) {
      spdlog::warn("peer {}: round {} timed out waiting for neighbours; mixing what arrived",
                   options.node_id, round);
    }
    for (const auto& [id, weight] : expected) {
      if (got.count(id)) continue;
      const auto lr = latest_round_from.find(id);
      spdlog::info("peer {}: round {} mixes without {} ({})", options.node_id, round, id,
                   !membership->is_alive(id) ? "gone from the view"
                   : lr != latest_round_from.end() && lr->second > round
                       ? "it is at round " + std::to_string(lr->second)
                       : "timed out");
    }
    crash_if("sent", round + 1);
    std::vector<Incoming> in;
    double total = 0.0;
    const bool choco = node->options().algorithm == Algorithm::kChoco;
    for (const auto& [id, weight] : expected) {
      auto it = got.find(id);
      if (it == got.end()) continue;
      if (choco) drain(id, round);
      if (choco && !node->has_copy(id)) continue;
      const double wgt = weight >= 0 ? weight : mh_weight(my_degree, it->second.degree);
      in.push_back({id, choco ? nullptr : &it->second.update, wgt, false});
      total += wgt;
    }
    if (node->options().algorithm == Algorithm::kDpsgd) remember_round(got);
    const Status st = node->mix(1.0 - total, in);
    if (!st.ok()) return fail(st.with_context("round " + std::to_string(round)));
    complete_round(in.size());
  }

  // D-PSGD: keeps this round (before its mix) for late messages and for resends.
  void remember_round(const std::map<std::string, Received>& got) {
    PastRound& p = past[round];
    p.msg = current_msg;
    p.degree = static_cast<uint32_t>(my_degree);
    p.sent_to = send_targets_;
    for (const auto& [id, weight] : expected) {
      if (!got.count(id)) p.missed[id] = weight;
    }
    if (!p.missed.empty()) {
      const auto x = node->params();
      p.own.assign(x.begin(), x.end());
    }
    while (past.size() > kPastRounds) past.erase(past.begin());
  }

  void complete_round(size_t mixed) {
    PeerRoundReport r;
    r.round = round + 1;
    r.live_members = membership->live_ids().size();
    r.neighbours = node->options().algorithm == Algorithm::kPushPull ? 1 : expected.size();
    r.mixed = mixed;
    r.train_loss = round_loss;
    r.bytes_sent = bytes;
    r.seconds = std::chrono::duration<double>(Clock::now() - round_started).count();
    r.caught_up = caught_up;
    r.resumed = resumed;
    caught_up = false;
    resumed = false;
    inbox.erase(inbox.begin(), inbox.upper_bound(round));
    ++round;
    current_msg.reset();
    phase = Phase::kWaiting;
    crash_if("mixed", round);
    if (!options.state_dir.empty()) {
      const Status st = save_state();
      if (!st.ok()) return fail(st.with_context("round " + std::to_string(round)));
    }
    crash_if("saved", round);
    if (hook) hook(r, node->params());
    maybe_begin();
  }

  void finish() {
    phase = Phase::kLinger;
    spdlog::info("peer {}: {} rounds done; lingering {} ms", options.node_id, round,
                 options.linger.count());
    phase_timer.expires_after(options.linger);
    phase_timer.async_wait([weak = weak_from_this()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (!ec && self) self->shutdown();
    });
  }

  void shutdown() {
    if (phase == Phase::kDone) return;
    membership->leave();
    const auto open_links = links;
    const auto open_pending = pending;
    for (const auto& [id, link] : open_links) {
      send_membership(*link);
      link->conn->close();
    }
    for (const auto& link : open_pending) link->conn->close();
    phase = Phase::kDone;
    stopped = true;
    heartbeat_timer.cancel();
    phase_timer.cancel();
    crash_timer.cancel();
    if (server) server->stop();
  }

  void fail(const Status& st) {
    if (!error.ok()) return;
    error = st.with_context("peer " + options.node_id);
    spdlog::error("{}", error.to_string());
    shutdown();
  }
};

Result<std::unique_ptr<Peer>> Peer::create(asio::io_context& io,
                                           std::shared_ptr<asio::ssl::context> server_ctx,
                                           std::shared_ptr<asio::ssl::context> client_ctx,
                                           PeerOptions options, compress::Layout layout,
                                           std::vector<float> initial,
                                           edge_client::LocalTrainer* trainer, RoundHook hook) {
  if (options.node_id.empty()) return invalid_argument("peer: empty node id");
  if (options.node.algorithm == Algorithm::kFedAvg) {
    return invalid_argument("peer: fedavg is a simulation-only reference, not a peer algorithm");
  }
  if (options.node.algorithm == Algorithm::kChoco && options.topology.time_varying) {
    return invalid_argument("peer: CHOCO needs a static topology");
  }
  for (const auto& s : options.seeds) {
    if (port_of(s) == 0) return invalid_argument("peer: seed '" + s + "' is not host:port");
  }
  std::string crash_stage;
  uint64_t crash_round = 0;
  if (!options.crash_point.empty()) {
    const auto at = options.crash_point.find('@');
    crash_stage = options.crash_point.substr(0, at);
    try {
      crash_round = at == std::string::npos ? 0 : std::stoull(options.crash_point.substr(at + 1));
    } catch (const std::exception&) {
      crash_round = 0;
    }
    const std::set<std::string> stages = {"trained", "sent", "mixed", "saved"};
    if (!stages.count(crash_stage) || crash_round == 0) {
      return invalid_argument("peer: crash point '" + options.crash_point +
                              "' is not STAGE@ROUND (trained, sent, mixed, saved; round from 1)");
    }
  }
  auto impl = std::make_shared<Impl>(io, std::move(server_ctx), std::move(client_ctx), options,
                                     layout, trainer, std::move(hook));
  ASSIGN_OR_RETURN(impl->numel, compress::validate_layout(layout), "peer");
  ASSIGN_OR_RETURN(impl->node, GossipNode::create(options.node, layout, std::move(initial)),
                   "peer " + options.node_id);
  impl->crash_stage = std::move(crash_stage);
  impl->crash_round = crash_round;
  if (!options.state_dir.empty()) {
    auto saved =
        load_peer_state(options.state_dir, layout, options.node_id,
                        std::string(algorithm_name(options.node.algorithm)), options.node.codec);
    if (saved.ok()) {
      RETURN_IF_ERROR(impl->node->restore(saved->params, saved->public_copy, saved->codec_state),
                      "peer " + options.node_id + ": " + options.state_dir);
      const uint64_t at = saved->round;
      impl->restore(std::move(*saved));
      spdlog::info("peer {}: resumed from {}/{} after round {}", options.node_id, options.state_dir,
                   kPeerStateFile, at);
      if (at >= options.num_rounds) {
        spdlog::warn(
            "peer {}: the state in {} is complete ({} of {} rounds): nothing is left to "
            "train; remove that folder to start afresh",
            options.node_id, options.state_dir, at, options.num_rounds);
      }
    } else if (saved.status().code() != StatusCode::kNotFound) {
      return saved.status().with_context("peer " + options.node_id);
    }
  }
  net::ServerOptions so;
  so.host = options.listen_host;
  so.port = options.listen_port;
  std::weak_ptr<Impl> weak = impl;
  ASSIGN_OR_RETURN(impl->server,
                   net::Server::listen(
                       io, impl->server_ctx, so,
                       [weak](std::shared_ptr<net::Connection> conn) {
                         auto self = weak.lock();
                         if (!self || self->stopped) return conn->close();
                         self->setup(std::move(conn), false, "");
                       },
                       [weak](const Status& st) {
                         if (auto self = weak.lock()) {
                           spdlog::warn("peer {}: refused a connection: {}", self->options.node_id,
                                        st.to_string());
                         }
                       }),
                   "peer " + options.node_id);
  const std::string host =
      options.advertise_host.empty() ? options.listen_host : options.advertise_host;
  const auto incarnation = static_cast<uint64_t>(
      std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  impl->self_address = host + ":" + std::to_string(impl->server->port());
  impl->membership = std::make_unique<Membership>(options.node_id, impl->self_address, incarnation,
                                                  options.fail_timeout);
  return std::unique_ptr<Peer>(new Peer(std::move(impl)));
}

Peer::~Peer() {
  impl_->stopped = true;
  impl_->heartbeat_timer.cancel();
  impl_->phase_timer.cancel();
  // Aborting runs the close handlers, which edit these maps: take them first.
  auto links = std::move(impl_->links);
  auto pending = std::move(impl_->pending);
  impl_->links.clear();
  impl_->pending.clear();
  for (auto& [id, link] : links)
    link->conn->abort(Status(StatusCode::kCancelled, "peer destroyed"));
  for (const auto& link : pending)
    link->conn->abort(Status(StatusCode::kCancelled, "peer destroyed"));
  if (impl_->server) impl_->server->stop();
}

void Peer::start() {
  auto& s = *impl_;
  if (s.has_saved_state) {
    // Our own state, not a neighbour's model: wait for the members we last saw, then go on.
    s.phase = Phase::kResuming;
    s.resumed = true;
    s.resume_deadline = Clock::now() + s.options.fail_timeout;
    s.dial_saved_members();
    s.heartbeat();
    return;
  }
  s.phase = s.options.seeds.empty() ? Phase::kWaiting : Phase::kJoining;
  if (s.phase == Phase::kJoining) {
    // No catch-up answer in time: start from our own model.
    s.phase_timer.expires_after(s.options.round_timeout);
    s.phase_timer.async_wait([weak = impl_->weak_from_this()](const asio::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->phase != Phase::kJoining) return;
      spdlog::warn("peer {}: no catch-up from the seeds; starting from our own model",
                   self->options.node_id);
      self->phase = Phase::kWaiting;
      self->maybe_begin();
    });
  }
  s.heartbeat();
}

void Peer::stop() { impl_->shutdown(); }
bool Peer::done() const { return impl_->phase == Phase::kDone; }
const Status& Peer::error() const { return impl_->error; }
uint16_t Peer::port() const { return impl_->server ? impl_->server->port() : 0; }
uint64_t Peer::rounds_completed() const { return impl_->round; }
std::vector<std::string> Peer::live_members() const { return impl_->membership->live_ids(); }
std::span<const float> Peer::params() const { return impl_->node->params(); }
uint64_t Peer::bytes_sent() const { return impl_->bytes; }
uint64_t Peer::resumed_at() const { return impl_->resumed_at; }
size_t Peer::drop_revoked(const std::set<std::string>& serials) {
  std::vector<std::shared_ptr<Link>> revoked;
  for (const auto& [id, link] : impl_->links) {
    if (serials.count(link->conn->peer().serial)) revoked.push_back(link);
  }
  for (const auto& link : impl_->pending) {
    if (serials.count(link->conn->peer().serial)) revoked.push_back(link);
  }
  for (const auto& link : revoked) {
    impl_->drop(link, permission_denied("certificate " + link->conn->peer().serial + " of " +
                                        link->conn->peer().node_id + " is revoked"));
  }
  return revoked.size();
}

Status run_peer_to_end(asio::io_context& io, Peer& peer) {
  peer.start();
  while (!peer.done()) {
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(100));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < until) {
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(20));
  }
  return peer.error();
}

}  // namespace starling::gossip
