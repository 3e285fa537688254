// Transport benchmark on loopback TLS 1.3: a chunked update streamed from client to server
// (CRC32C per chunk and SHA-256 checked) in MB/s beside `openssl speed -evp aes-256-gcm` run in
// the same process; small-message round-trip latency; idle memory of many connections.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/net/certs.h"
#include "core/net/chunk_stream.h"
#include "core/net/client.h"
#include "core/net/server.h"
#include "core/util/rng.h"

namespace net = starling::net;
namespace v1 = starling::v1;
using Clock = std::chrono::steady_clock;
using starling::Status;

namespace {

[[noreturn]] void die(const Status& s) {
  std::fprintf(stderr, "transport_bench: %s\n", s.to_string().c_str());
  std::exit(1);
}
template <typename T>
T must(starling::Result<T> r) {
  if (!r.ok()) die(r.status());
  return std::move(r).value();
}

// Runs `io` until done() or 120 s.
void run_until(asio::io_context& io, const std::function<bool()>& done) {
  const auto end = Clock::now() + std::chrono::seconds(120);
  while (!done()) {
    if (Clock::now() > end) die(starling::deadline_exceeded("benchmark step hung"));
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(10));
  }
}

// CPU seconds of all threads of this process (both ends of the stream).
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU seconds of one thread of this process (CLOCK_THREAD_CPUTIME_ID of that thread).
double thread_cpu_seconds(pthread_t thread) {
  clockid_t id{};
  timespec ts{};
  if (pthread_getcpuclockid(thread, &id) != 0 || clock_gettime(id, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// `openssl speed` for one core, in MB/s (its figure is 1000s of bytes per second).
std::optional<double> openssl_speed_mbs() {
  FILE* p = popen("openssl speed -evp aes-256-gcm -seconds 2 -bytes 16384 2>/dev/null", "r");
  if (p == nullptr) return std::nullopt;
  std::optional<double> out;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    double kbs = 0;
    if (std::sscanf(line, "AES-256-GCM %lfk", &kbs) == 1) out = kbs / 1000.0;
  }
  pclose(p);
  return out;
}

// SHA-256 of `bytes` on this core with the receiver's hasher (net::Sha256), best of 3: the
// ceiling of one stream, since a receiver hashes every byte of the payload.
double sha256_mbs(std::string_view bytes) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    net::Sha256 sha;
    const auto t0 = Clock::now();
    sha.update(bytes);
    (void)sha.finish();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return static_cast<double>(bytes.size()) / 1e6 / best;
}

// The server side, on its own thread: reassembles transfers and echoes small messages.
struct BenchServer {
  BenchServer(std::shared_ptr<asio::ssl::context> ctx, net::ServerOptions options,
              net::ChunkReceiver::Hashing hash_mode, bool protobuf_chunks)
      : hashing(hash_mode) {
    server = must(net::Server::listen(
        io, std::move(ctx), options,
        [this, protobuf_chunks](std::shared_ptr<net::Connection> c) {
          ++connections;
          auto weak = std::weak_ptr<net::Connection>(c);
          // Chunks arrive as views into the receive buffer, not copied into an Envelope.
          if (!protobuf_chunks) {
            c->set_chunk_handler([this, weak](const starling::wire::ChunkView& chunk) {
              on_chunk(weak.lock(), chunk);
            });
          }
          c->start([this, weak](v1::Envelope e) { on_message(weak.lock(), std::move(e)); },
                   [](const Status&) {});
          held.push_back(std::move(c));
        },
        [](const Status& s) { std::fprintf(stderr, "server: %s\n", s.to_string().c_str()); }));
    port = server->port();
    thread = std::thread([this] {
      while (!stop) io.run_for(std::chrono::milliseconds(50));
    });
  }
  ~BenchServer() {
    stop = true;
    thread.join();
  }

  void on_chunk(const std::shared_ptr<net::Connection>& c, const starling::wire::ChunkView& chunk) {
    if (!c) return;
    const auto it = receivers.find(c.get());
    if (it == receivers.end()) die(starling::failed_precondition("chunk before header"));
    net::ChunkReceiver& receiver = it->second;
    if (Status s = receiver.accept(chunk); !s.ok()) die(s);
    if (!receiver.all_received()) return;
    if (Status s = receiver.finish(); !s.ok()) die(s);
    v1::Envelope reply;
    *reply.mutable_chunk_ack() = receiver.ack();
    receivers.erase(it);
    if (Status s = c->send(reply); !s.ok()) die(s);
  }

  void on_message(const std::shared_ptr<net::Connection>& c, v1::Envelope e) {
    if (!c) return;
    v1::Envelope reply;
    if (e.has_update_upload()) {
      receivers.insert_or_assign(
          c.get(), must(net::ChunkReceiver::create(
                       e.update_upload().transfer(), uint64_t{1} << 40,
                       [](uint64_t, std::string_view) { return starling::ok_status(); }, hashing)));
      return;
    }
    if (e.has_chunk()) {
      on_chunk(c, starling::wire::view_of(e.chunk()));
      return;
    }
    if (e.has_heartbeat()) {
      reply.mutable_heartbeat()->set_echo_unix_ms(e.heartbeat().sent_unix_ms());
    } else {
      return;
    }
    if (Status s = c->send(reply); !s.ok()) die(s);
  }

  asio::io_context io;
  std::unique_ptr<net::Server> server;
  std::vector<std::shared_ptr<net::Connection>> held;
  std::map<const net::Connection*, net::ChunkReceiver> receivers;  // transfers in progress
  const net::ChunkReceiver::Hashing hashing;
  std::atomic<int> connections{0};
  std::atomic<bool> stop{false};
  uint16_t port = 0;
  std::thread thread;
};

// Streams the sender's payload over `conn` (started, with its replies landing in *reply) and
// runs `io` until the server acknowledges the whole transfer. The sender hashed the payload
// when it was made, before this (as a client does before its upload turn).
void stream_payload(asio::io_context& io, net::Connection& conn, std::optional<v1::Envelope>* reply,
                    const net::ChunkSender& sender, size_t max_queue_bytes, bool protobuf_chunks) {
  uint64_t next = 0;
  auto pump = [&] {
    while (next < sender.num_chunks() && conn.queued_bytes() < max_queue_bytes / 2) {
      if (protobuf_chunks) {
        v1::Envelope e;
        *e.mutable_chunk() = must(sender.chunk(next));
        if (Status s = conn.send(e); !s.ok()) die(s);
      } else if (Status s = conn.send_chunk(must(sender.chunk_view(next))); !s.ok()) {
        die(s);
      }
      ++next;
    }
  };
  conn.set_drain_handler(pump);
  reply->reset();
  v1::Envelope head;
  *head.mutable_update_upload()->mutable_transfer() = sender.header();
  if (Status s = conn.send(head); !s.ok()) die(s);
  pump();
  run_until(io, [&] { return reply->has_value(); });
  conn.set_drain_handler(nullptr);
  if (!(*reply)->has_chunk_ack() || !(*reply)->chunk_ack().complete()) {
    die(starling::data_loss("transfer not acknowledged as complete"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"starling transport benchmark (loopback TLS 1.3)"};
  int64_t mb = 500;
  uint32_t chunk_kib = 1024;
  int pings = 2000;
  int connections = 1000;
  app.add_option("--mb", mb, "Size of the streamed update, MB")->capture_default_str();
  app.add_option("--chunk-kib", chunk_kib, "Chunk size, KiB")->capture_default_str();
  app.add_option("--pings", pings, "Round trips of a small message")->capture_default_str();
  app.add_option("--connections", connections, "Idle connections to hold (0: skip)")
      ->capture_default_str();
  bool background_hash = true;
  app.add_option("--background-hash", background_hash,
                 "Receiver hashes SHA-256 on a helper thread (false: on the I/O thread)")
      ->capture_default_str();
  bool protobuf_chunks = false;
  int streams = 2;
  app.add_option("--streams", streams,
                 "Concurrent uploads, each from its own client thread, into the one server "
                 "thread (1: skip)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_flag("--protobuf-chunks", protobuf_chunks,
               "Chunks as v1::Envelope through send() and the message handler (copies), not "
               "send_chunk() and a chunk handler");
  CLI11_PARSE(app, argc, argv);

  net::CertSpec spec;
  spec.common_name = "bench-federation";
  spec.role = net::CertRole::kCa;
  spec.valid_until_s = 2 * 365 * 86400;  // outlives the node certificates: no capping
  const net::Credential ca = must(net::make_ca(spec));
  auto tls_for = [&](const char* name, net::CertRole role) {
    net::CertSpec s;
    s.common_name = name;
    s.role = role;
    s.sans = {"IP:127.0.0.1"};
    net::Credential c = must(net::issue_cert(ca, s));
    return net::TlsConfig{must(net::cert_to_pem(ca.cert.get())),
                          must(net::cert_to_pem(c.cert.get())), must(net::key_to_pem(c.key.get())),
                          "", true};
  };
  net::ServerOptions so;
  so.max_connections = static_cast<size_t>(connections) + 16;
  so.connection.max_frame_bytes = chunk_kib * 1024 + 4096;
  BenchServer server(must(net::make_tls_context(tls_for("aggregator", net::CertRole::kServer),
                                                net::TlsSide::kServer)),
                     so,
                     background_hash ? net::ChunkReceiver::Hashing::kBackground
                                     : net::ChunkReceiver::Hashing::kInline,
                     protobuf_chunks);
  auto client_ctx =
      must(net::make_tls_context(tls_for("client", net::CertRole::kClient), net::TlsSide::kClient));
  asio::io_context io;
  net::ClientOptions co;
  co.host = "127.0.0.1";
  co.port = server.port;
  co.connection.max_frame_bytes = so.connection.max_frame_bytes;
  co.connection.max_queue_bytes = 8 * chunk_kib * 1024;
  auto open = [&] {
    std::optional<starling::Result<std::shared_ptr<net::Connection>>> r;
    net::connect(io, client_ctx, co, [&](starling::Result<std::shared_ptr<net::Connection>> x) {
      r.emplace(std::move(x));
    });
    run_until(io, [&] { return r.has_value(); });
    return must(std::move(*r));
  };

  // 1. Stream the update.
  std::string payload(static_cast<size_t>(mb) * 1'000'000, '\0');
  starling::Rng rng(1);
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    const uint64_t v = rng.next_u64();
    std::memcpy(&payload[i], &v, 8);
  }
  auto conn = open();
  std::optional<v1::Envelope> reply;
  conn->start([&](v1::Envelope e) { reply = std::move(e); }, [](const Status&) {});
  const net::ChunkSender sender(1, payload, chunk_kib * 1024, "bench/bytes");
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();
  const double sender0 = thread_cpu_seconds(pthread_self());
  const double receiver0 = thread_cpu_seconds(server.thread.native_handle());
  stream_payload(io, *conn, &reply, sender, co.connection.max_queue_bytes, protobuf_chunks);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double mbs = static_cast<double>(payload.size()) / 1e6 / seconds;
  // On a shared machine wall time includes waiting for a core; CPU time does not.
  const double cpu_s = cpu_seconds() - cpu0;
  const double mb_per_cpu_s = static_cast<double>(payload.size()) / 1e6 / cpu_s;
  // Per thread: the sender's I/O thread, the receiver's, and the rest (the receiver's hashing
  // thread). With a free core for each, the stream could go as fast as the busiest one allows.
  const double sender_s = thread_cpu_seconds(pthread_self()) - sender0;
  const double receiver_s = thread_cpu_seconds(server.thread.native_handle()) - receiver0;
  const double other_s = std::max(0.0, cpu_s - sender_s - receiver_s);
  const double bound_mbs =
      static_cast<double>(payload.size()) / 1e6 / std::max({sender_s, receiver_s, other_s, 1e-9});

  // 1b. Concurrent uploads: each client on its own thread and connection, all into the one
  // server thread (as the aggregator's), each hashing on its receiver's helper thread.
  double concurrent_mbs = 0;
  if (streams > 1) {
    std::vector<std::thread> clients;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    for (int i = 0; i < streams; ++i) {
      clients.emplace_back([&, i] {
        asio::io_context cio;
        std::optional<starling::Result<std::shared_ptr<net::Connection>>> r;
        net::connect(
            cio, client_ctx, co,
            [&](starling::Result<std::shared_ptr<net::Connection>> x) { r.emplace(std::move(x)); });
        run_until(cio, [&] { return r.has_value(); });
        auto c = must(std::move(*r));
        std::optional<v1::Envelope> got;
        c->start([&](v1::Envelope e) { got = std::move(e); }, [](const Status&) {});
        const net::ChunkSender mine(100 + static_cast<uint64_t>(i), payload, chunk_kib * 1024,
                                    "bench/bytes");
        ++ready;
        while (!go.load()) std::this_thread::yield();
        stream_payload(cio, *c, &got, mine, co.connection.max_queue_bytes, protobuf_chunks);
        c->close();
        run_until(cio, [&] { return !c->is_open(); });
      });
    }
    while (ready.load() < streams) std::this_thread::yield();
    const auto c0 = Clock::now();
    go = true;
    for (auto& t : clients) t.join();
    const double s_all = std::chrono::duration<double>(Clock::now() - c0).count();
    concurrent_mbs = static_cast<double>(payload.size()) * streams / 1e6 / s_all;
  }

  // 2. Round-trip latency of a small message.
  std::vector<double> rtt_us;
  for (int i = 0; i < pings; ++i) {
    reply.reset();
    v1::Envelope hb;
    hb.mutable_heartbeat()->set_sent_unix_ms(static_cast<uint64_t>(i));
    const auto t = Clock::now();
    if (Status s = conn->send(hb); !s.ok()) die(s);
    run_until(io, [&] { return reply.has_value(); });
    rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  std::sort(rtt_us.begin(), rtt_us.end());
  const auto pct = [&](double q) {
    return rtt_us.empty() ? 0.0
                          : rtt_us[static_cast<size_t>(q * static_cast<double>(rtt_us.size() - 1))];
  };

  // 3. Many idle connections.
  double per_conn_kib = 0;
  if (connections > 0) {
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    const double before = rss_mib();
    std::vector<std::shared_ptr<net::Connection>> idle;
    for (int i = 0; i < connections; ++i) {
      idle.push_back(open());
      idle.back()->start([](v1::Envelope) {}, [](const Status&) {});
    }
    const auto all = static_cast<int>(idle.size()) + 1;
    run_until(io, [&] { return server.connections.load() == all; });
    per_conn_kib = (rss_mib() - before) * 1024.0 / connections;
  }

  const auto ceiling = openssl_speed_mbs();
  const double sha_mbs = sha256_mbs(payload);
  std::printf(
      "{\"stream_mb\": %lld, \"chunk_kib\": %u, \"protobuf_chunks\": %s, \"background_hash\": %s, "
      "\"tls_mb_s\": %.1f, "
      "\"tls_mb_per_cpu_s\": %.1f, \"cpu_s_sender\": %.3f, \"cpu_s_receiver\": %.3f, "
      "\"cpu_s_other\": %.3f, \"busiest_thread_bound_mb_s\": %.1f, "
      "\"openssl_aes256gcm_mb_s\": "
      "%.1f, \"sha256_mb_s\": %.1f, "
      "\"streams\": %d, \"concurrent_mb_s\": %.1f, "
      "\"rtt_us_p50\": %.1f, \"rtt_us_p99\": %.1f, \"connections\": %d, "
      "\"idle_kib_per_connection\": %.1f}\n",
      static_cast<long long>(mb), chunk_kib, protobuf_chunks ? "true" : "false",
      background_hash ? "true" : "false", mbs, mb_per_cpu_s, sender_s, receiver_s, other_s,
      bound_mbs, ceiling.value_or(0.0), sha_mbs, streams, concurrent_mbs, pct(0.5), pct(0.99),
      connections, per_conn_kib);
  std::printf(
      "stream %lld MB over TLS 1.3 loopback: %.0f MB/s, %.0f MB per CPU-second of sender and "
      "receiver together (openssl speed aes-256-gcm, one core: %.0f MB/s; SHA-256 of the whole "
      "payload, which the receiver computes, one core: %.0f MB/s)\n",
      static_cast<long long>(mb), mbs, mb_per_cpu_s, ceiling.value_or(0.0), sha_mbs);
  std::printf(
      "CPU seconds: sender %.2f, receiver I/O %.2f, other (receiver hashing) %.2f; with a core "
      "for each, the busiest allows %.0f MB/s\n",
      sender_s, receiver_s, other_s, bound_mbs);
  if (streams > 1) {
    std::printf(
        "%d concurrent streams (a client thread each, one server thread, %u cores here): "
        "%.0f MB/s together, %.2fx one stream\n",
        streams, std::thread::hardware_concurrency(), concurrent_mbs, concurrent_mbs / mbs);
  }
  std::printf("small-message round trip: p50 %.0f us, p99 %.0f us over %d pings\n", pct(0.5),
              pct(0.99), pings);
  if (connections > 0) {
    std::printf("%d idle connections held; %.1f KiB per connection (client and server side)\n",
                connections, per_conn_kib);
  }
  return 0;
}
