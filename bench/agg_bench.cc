// agg_bench: (1) aggregation throughput, in GB/s of update input folded into the running
// weighted sum, for --updates updates of --params float32 parameters (identity and int8
// blockwise), each a serialized EncodedUpdate parsed, checked and folded as the aggregator does,
// one after another (generated and encoded once, so memory holds one update, not 32); beside
// the machine's memcpy bandwidth and Flower's numpy `aggregate` (bench/agg_bench.py, run through
// --python) in the same run. (2) The aggregator's peak RSS with 10 and 1000 clients per round:
// the server runs in a child process, the clients are lightweight fakes over loopback mutual TLS
// that stream one stored update (shared by all) after receiving the model. (3) The root of a
// tier (--tier-clients, --tier-leaves): its peak RSS and bytes per round with three leaf
// aggregators serving 1000 clients in all, beside the same root with three direct clients.
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/accumulator.h"
#include "aggregator/aggregator.h"
#include "aggregator/leaf.h"
#include "core/compress/codec.h"
#include "core/net/certs.h"
#include "core/net/client.h"
#include "core/net/hello.h"
#include "core/net/tls.h"
#include "core/util/rng.h"
#include "edge_client/transfer.h"

namespace {

using namespace starling;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// kB from /proc/self/status ("VmHWM": peak resident set, "VmRSS": current).
long proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stol(line.substr(prefix.size()));
  }
  return -1;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "agg_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T value_or_die(Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.status().to_string());
  return std::move(*r);
}

// ---------------------------------------------------------------------------------------------
// Throughput.

struct FoldResult {
  std::string codec;
  std::string path = "fold_bytes";  // or "stream fold, N threads"
  int threads = 1;
  double update_mb = 0;  // one serialized update
  double seconds = 0;
  double input_gbps = 0;        // serialized update bytes folded per second
  double param_gbps = 0;        // float32 parameter bytes (4 per parameter) folded per second
  double decode_only_gbps = 0;  // decode_add of a parsed update, input bytes per second
};

// A model of `params` parameters laid out as GPT-2's tensors are: many of a few million each
// (768 x 3072 MLP matrices), so a streamed fold has windows to spread over threads.
compress::Layout model_layout(int64_t params) {
  constexpr int64_t kTensor = 768 * 3072;
  compress::Layout layout;
  for (int64_t offset = 0; offset < params; offset += kTensor) {
    const int64_t n = std::min(kTensor, params - offset);
    layout.push_back({"t" + std::to_string(layout.size()), Shape{n}, offset});
  }
  return layout;
}

// `threads` 0: the serialized EncodedUpdate through fold_bytes (one thread); else the update
// stream the aggregator receives, through fold_payload with that many fold threads.
FoldResult bench_fold(const std::string& codec_spec, int64_t params, int updates,
                      std::span<const float> delta, int threads = 0) {
  auto codec = value_or_die(compress::make_codec(codec_spec, model_layout(params), 1), "codec");
  std::string bytes;
  {
    auto encoded = value_or_die(codec->encode(delta), "encode");
    bytes = threads > 0 ? compress::UpdateStreamWriter(encoded).serialize()
                        : compress::serialize_update(encoded);
  }
  aggregator::AggregationRule rule;
  rule.fold_threads = std::max(threads, 1);
  aggregator::UpdateAccumulator acc(params, rule);
  const auto t0 = Clock::now();
  for (int u = 0; u < updates; ++u) {
    const float w = static_cast<float>(1 + u % 3);
    const Status st = threads > 0 ? acc.fold_payload(bytes, w) : acc.fold_bytes(bytes, w);
    if (!st.ok()) die("fold: " + st.to_string());
  }
  FoldResult r;
  r.codec = codec_spec;
  r.threads = std::max(threads, 1);
  if (threads > 0) r.path = "stream fold " + std::to_string(threads) + "t";
  r.seconds = seconds_since(t0);
  r.update_mb = static_cast<double>(bytes.size()) / 1e6;
  r.input_gbps = static_cast<double>(bytes.size()) * updates / r.seconds / 1e9;
  r.param_gbps = static_cast<double>(params) * 4.0 * updates / r.seconds / 1e9;
  if (threads > 0) return r;  // decode-only is the same for both paths
  // The same without parsing: decode_add of one parsed update, 3 times, best.
  auto parsed = value_or_die(compress::parse_update(bytes), "parse");
  bytes.clear();
  bytes.shrink_to_fit();
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t1 = Clock::now();
    if (!acc.fold(parsed, 1.0f).ok()) die("fold parsed");
    best = std::min(best, seconds_since(t1));
  }
  r.decode_only_gbps = static_cast<double>(parsed.payload_bytes()) / best / 1e9;
  return r;
}

// memcpy of `bytes` bytes split over `threads` threads, best of 5: bytes copied per second. The
// machine's memory ceiling for that many cores, which a fold's thread scaling meets.
double memcpy_gbps(size_t bytes, int threads = 1) {
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 0);
  const auto nt = static_cast<size_t>(std::max(threads, 1));
  const size_t slice = (bytes + nt - 1) / nt;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (size_t t = 1; t < nt; ++t) {
      const size_t begin = std::min(bytes, t * slice), end = std::min(bytes, begin + slice);
      pool.emplace_back([&, begin, end] { std::memcpy(&b[begin], &a[begin], end - begin); });
    }
    std::memcpy(b.data(), a.data(), std::min(bytes, slice));
    for (auto& th : pool) th.join();
    best = std::min(best, seconds_since(t0));
    a[static_cast<size_t>(rep)] = b[bytes - 1 - static_cast<size_t>(rep)];  // keep both live
  }
  return static_cast<double>(bytes) / best / 1e9;
}

// Runs the Flower-style peer; returns its JSON line, or null when it failed.
nlohmann::json run_flower(const std::string& python, const std::string& script, int64_t params,
                          int updates) {
  const std::string cmd = python + " " + script + " --params " + std::to_string(params) +
                          " --updates " + std::to_string(updates);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return nullptr;
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  if (::pclose(p) != 0) {
    std::fprintf(stderr, "agg_bench: %s failed\n", cmd.c_str());
    return nullptr;
  }
  const auto last = out.find_last_of('{');
  if (last == std::string::npos) return nullptr;
  return nlohmann::json::parse(out.substr(last), nullptr, false);
}

// ---------------------------------------------------------------------------------------------
// Peak RSS of the aggregator with many clients.

// A client that says Hello, waits for the model's last chunk, and then uploads the stored
// update stream (one payload shared by every fake client, the format edge clients send), every
// round, until the run is complete; a Heartbeat every 20 s while it waits, as edge clients do.
struct FakeClient {
  FakeClient(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx, uint16_t port,
             std::string id, std::shared_ptr<const std::string> update, uint32_t chunk_bytes)
      : node_id(std::move(id)), payload(std::move(update)), chunk(chunk_bytes), heartbeat(io) {
    net::ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.server_name = "localhost";
    o.connection.deadlines.handshake = std::chrono::milliseconds(60'000);
    o.connection.deadlines.connect = std::chrono::milliseconds(60'000);
    net::connect(io, std::move(ctx), o, [this](Result<std::shared_ptr<net::Connection>> r) {
      if (!r.ok()) {
        error = r.status().to_string();
        done = true;
        return;
      }
      conn = *r;
      conn->start([this](v1::Envelope e) { on_message(std::move(e)); },
                  [this](const Status& st) {
                    if (!finished && error.empty()) error = "closed: " + st.to_string();
                    done = true;
                    heartbeat.cancel();
                  });
      v1::Envelope hello;
      *hello.mutable_hello() = net::make_hello(node_id, v1::ROLE_CLIENT, {"identity"}, 1u << 20);
      (void)conn->send(hello);
      beat();
    });
  }

  void beat() {
    heartbeat.expires_after(std::chrono::seconds(20));
    heartbeat.async_wait([this](const asio::error_code& ec) {
      if (ec || done || !conn) return;
      (void)conn->send(net::make_heartbeat());
      beat();
    });
  }

  void on_message(v1::Envelope e) {
    if (e.has_round_plan()) plan = e.round_plan();
    if (e.has_model_download()) {
      download = e.model_download().transfer();
      if (download.num_chunks() == 0) upload();
    }
    if (e.has_chunk() && e.chunk().transfer_id() == download.transfer_id() &&
        e.chunk().index() + 1 == download.num_chunks()) {
      upload();
    }
    if (e.has_chunk_ack() && pump && !e.chunk_ack().complete()) {
      if (!pump->started()) {
        pump->start();  // the aggregator granted this upload its turn
      } else {
        pump->resume_from(e.chunk_ack().next_index());
      }
    }
    if (e.has_error()) {
      if (e.error().message() == edge_client::kFederationComplete) {
        finished = true;
        conn->close();
      } else if (!e.error().retryable()) {
        error = e.error().message();
      }
    }
  }

  void upload() {
    if (pump) pump->cancel();
    pump = std::make_shared<edge_client::ChunkPump>(
        conn, payload, next_transfer++, chunk, std::string(edge_client::kUpdateStreamContentType),
        size_t{2} * chunk);
    v1::Envelope up;
    auto* u = up.mutable_update_upload();
    u->set_round(plan.round());
    u->set_base_version(plan.model_version());
    u->set_num_samples(1);
    u->set_codec("identity");
    u->set_train_loss(1.0f);
    *u->mutable_transfer() = pump->header();
    (void)conn->send(up);  // the chunks follow the aggregator's grant
    ++uploads;
  }

  std::string node_id;
  std::shared_ptr<const std::string> payload;
  uint32_t chunk;
  std::shared_ptr<net::Connection> conn;
  std::shared_ptr<edge_client::ChunkPump> pump;
  asio::steady_timer heartbeat;
  v1::RoundPlan plan;
  v1::TransferHeader download;
  uint64_t next_transfer = 1;
  int uploads = 0;
  bool finished = false;
  bool done = false;
  std::string error;
};

struct RssOptions {
  int64_t params = 262'144;  // 1 MiB float32 model
  uint32_t rounds = 2;
  uint32_t chunk_bytes = 16u << 10;
  size_t download_window_bytes = 8u << 20;  // the product's defaults
  uint64_t download_memory_mb = 64;
  uint32_t upload_concurrency = 32;
  uint64_t upload_memory_mb = 16;
  std::string spill_dir = "build/agg_bench_spill";
};

struct RssResult {
  int clients = 0;
  int leaves = 0;                 // leaf aggregators between the clients and the server
  double root_bytes_round = 0;    // update bytes the server received per round
  double root_updates_round = 0;  // updates it folded per round
  long start_kb = 0;              // RSS when listening, before any client
  long peak_kb = 0;               // VmHWM at the end
  double seconds = 0;
  int uploads = 0;
  double update_mib = 0;  // one serialized update
  bool ok = false;
};

net::TlsConfig tls_config(const net::Credential& cred, const std::string& ca_pem) {
  net::TlsConfig t;
  t.ca_pem = ca_pem;
  t.cert_pem = value_or_die(net::cert_to_pem(cred.cert.get()), "cert pem");
  t.key_pem = value_or_die(net::key_to_pem(cred.key.get()), "key pem");
  return t;
}

// An aggregator of the RSS runs: every one of `contributors` each round, `connections` at most.
aggregator::AggregatorOptions server_options(const RssOptions& ro, int contributors,
                                             int connections) {
  aggregator::AggregatorOptions o;
  o.num_rounds = ro.rounds;
  o.clients_per_round = static_cast<uint32_t>(contributors);
  o.min_available = o.clients_per_round;
  o.round_deadline = std::chrono::milliseconds(600'000);
  o.codec = "identity";
  o.chunk_bytes = ro.chunk_bytes;
  o.download_window_bytes = ro.download_window_bytes;
  o.download_memory_bytes = ro.download_memory_mb << 20;
  o.upload_concurrency = ro.upload_concurrency;
  o.upload_memory_bytes = ro.upload_memory_mb << 20;
  o.spill_dir = ro.spill_dir;
  o.server.max_connections = static_cast<size_t>(connections) + 64;
  o.server.connection.deadlines.handshake = std::chrono::milliseconds(60'000);
  return o;
}

// `clients` fake clients under the measured aggregator, directly or (leaves > 0) through that
// many leaf aggregators (aggregator/leaf.h) run in this process.
RssResult bench_rss(int clients, const RssOptions& ro, int leaves = 0) {
  auto ca = value_or_die(net::make_ca({"agg-bench", net::CertRole::kCa, {}}), "CA");
  const std::string ca_pem = value_or_die(net::cert_to_pem(ca.cert.get()), "CA pem");
  const auto server_tls = tls_config(
      value_or_die(
          net::issue_cert(
              ca, {"aggregator", net::CertRole::kServer, {"DNS:localhost", "IP:127.0.0.1"}}),
          "server cert"),
      ca_pem);
  int to_parent[2];
  if (::pipe(to_parent) != 0) die("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) {  // the aggregator
    ::close(to_parent[0]);
    asio::io_context io;
    aggregator::AggregatorOptions o = server_options(ro, leaves ? leaves : clients, clients);
    auto ctx = value_or_die(net::make_tls_context(server_tls, net::TlsSide::kServer), "tls");
    long bytes_in = 0;
    long updates_in = 0;
    auto agg = value_or_die(aggregator::Aggregator::create(
                                io, ctx, o, compress::flat_layout(ro.params),
                                std::vector<float>(static_cast<size_t>(ro.params), 0.0f),
                                [&](const aggregator::RoundReport& r, std::span<const float>) {
                                  bytes_in += static_cast<long>(r.update_bytes);
                                  updates_in += r.updates;
                                  return true;
                                }),
                            "aggregator");
    const long start_kb = proc_status_kb("VmRSS");
    const uint16_t port = agg->port();
    if (::write(to_parent[1], &port, sizeof(port)) != sizeof(port)) ::_exit(2);
    while (!agg->done()) io.run_one_for(std::chrono::milliseconds(100));
    const auto until = Clock::now() + std::chrono::seconds(2);  // let clients hear the end
    while (Clock::now() < until) io.run_one_for(std::chrono::milliseconds(50));
    long out[4] = {start_kb, proc_status_kb("VmHWM"), bytes_in, updates_in};
    if (!agg->error().ok()) out[1] = -1;
    if (::write(to_parent[1], out, sizeof(out)) != sizeof(out)) ::_exit(2);
    ::_exit(0);
  }
  ::close(to_parent[1]);
  // The clients' and leaves' certificates are made after the fork: the server's memory holds
  // none of them (as a real server would not).
  std::vector<net::TlsConfig> leaf_tls;
  for (int l = 0; l < leaves; ++l) {
    leaf_tls.push_back(
        tls_config(value_or_die(net::issue_cert(ca, {"leaf" + std::to_string(l),
                                                     net::CertRole::kLeaf,
                                                     {"DNS:localhost", "IP:127.0.0.1"}}),
                                "leaf cert"),
                   ca_pem));
  }
  std::vector<net::TlsConfig> client_tls;
  for (int k = 0; k < clients; ++k) {
    client_tls.push_back(tls_config(
        value_or_die(net::issue_cert(ca, {"c" + std::to_string(k), net::CertRole::kClient, {}}),
                     "client cert"),
        ca_pem));
  }

  uint16_t port = 0;
  if (::read(to_parent[0], &port, sizeof(port)) != sizeof(port)) die("server did not start");

  // The stored update: random values, encoded once, shared by every client.
  std::vector<float> delta(static_cast<size_t>(ro.params));
  Rng rng(3);
  for (auto& v : delta) v = static_cast<float>(rng.normal() * 1e-3);
  auto codec =
      value_or_die(compress::make_codec("identity", compress::flat_layout(ro.params), 1), "codec");
  auto payload = std::make_shared<const std::string>(
      compress::UpdateStreamWriter(value_or_die(codec->encode(delta), "encode")).serialize());
  std::vector<float>().swap(delta);

  asio::io_context io;
  // The leaves: each an aggregator in leaf mode for its share of the clients, with its link to
  // the server on a thread of its own.
  std::vector<std::unique_ptr<aggregator::Aggregator>> leaf_aggs;
  std::vector<std::unique_ptr<aggregator::Leaf>> leaf_links;
  for (int l = 0; l < leaves; ++l) {
    const int mine = clients / leaves + (l < clients % leaves ? 1 : 0);
    aggregator::AggregatorOptions o = server_options(ro, mine, mine);
    o.leaf = true;
    o.node_id = "leaf" + std::to_string(l);
    const auto& tls = leaf_tls[static_cast<size_t>(l)];
    leaf_aggs.push_back(
        value_or_die(aggregator::Aggregator::create(
                         io, value_or_die(net::make_tls_context(tls, net::TlsSide::kServer), "tls"),
                         o, compress::flat_layout(ro.params),
                         std::vector<float>(static_cast<size_t>(ro.params), 0.0f)),
                     "leaf"));
    aggregator::LeafOptions lo;
    lo.upstream.connect.host = "127.0.0.1";
    lo.upstream.connect.port = port;
    lo.upstream.connect.server_name = "localhost";
    lo.upstream.node_id = o.node_id;
    lo.upstream.chunk_bytes = ro.chunk_bytes;
    leaf_links.push_back(value_or_die(
        aggregator::Leaf::start(
            io, *leaf_aggs.back(), compress::flat_layout(ro.params),
            value_or_die(net::make_tls_context(tls, net::TlsSide::kClient), "tls"), lo),
        "leaf link"));
  }
  std::vector<std::unique_ptr<FakeClient>> fakes;
  const auto t0 = Clock::now();
  for (int k = 0; k < clients; ++k) {
    auto ctx = value_or_die(
        net::make_tls_context(client_tls[static_cast<size_t>(k)], net::TlsSide::kClient), "tls");
    const uint16_t to = leaves ? leaf_aggs[static_cast<size_t>(k % leaves)]->port() : port;
    fakes.push_back(std::make_unique<FakeClient>(io, ctx, to, "c" + std::to_string(k), payload,
                                                 ro.chunk_bytes));
  }
  std::vector<bool> ended(static_cast<size_t>(leaves), false);
  const auto deadline = Clock::now() + std::chrono::seconds(900);
  while (Clock::now() < deadline &&
         !std::all_of(fakes.begin(), fakes.end(), [](const auto& f) { return f->done; })) {
    io.run_one_for(std::chrono::milliseconds(100));
    for (size_t l = 0; l < leaf_links.size(); ++l) {
      if (!ended[l] && leaf_links[l]->stopped()) {  // the server ended the federation
        leaf_aggs[l]->end_federation();
        ended[l] = true;
      }
    }
  }
  for (int i = 0; i < 20; ++i) io.run_one_for(std::chrono::milliseconds(10));
  leaf_links.clear();
  RssResult r;
  r.clients = clients;
  r.leaves = leaves;
  r.seconds = seconds_since(t0);
  long out[4] = {0, 0, 0, 0};
  const bool got = ::read(to_parent[0], out, sizeof(out)) == sizeof(out);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(to_parent[0]);
  r.update_mib = static_cast<double>(payload->size()) / 1048576;
  r.start_kb = out[0];
  r.peak_kb = out[1];
  r.root_bytes_round = static_cast<double>(out[2]) / ro.rounds;
  r.root_updates_round = static_cast<double>(out[3]) / ro.rounds;
  int finished = 0;
  int reported = 0;
  for (const auto& f : fakes) {
    r.uploads += f->uploads;
    finished += f->finished ? 1 : 0;
    if (!f->finished && !f->error.empty() && reported++ < 3) {  // the first few failures
      std::fprintf(stderr, "agg_bench: client %s: %s\n", f->node_id.c_str(), f->error.c_str());
    }
  }
  r.ok = got && out[1] > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && finished == clients;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Aggregation throughput and server memory of the starling aggregator"};
  int64_t params = 124'439'808;  // GPT-2 small
  int updates = 32;
  int flower_updates = 3;
  std::string python;
  std::string peer = "bench/agg_bench.py";
  std::string int8_spec = "int8:block=256";
  std::vector<int> fold_threads = {1, 2};
  RssOptions ro;
  std::vector<int> rss_clients = {10, 1000};
  bool skip_throughput = false;
  bool skip_rss = false;
  int tier_clients = 1000;
  int tier_leaves = 3;
  bool skip_tiers = false;
  app.add_option("--params", params, "Parameters per update (float32)");
  app.add_option("--updates", updates, "Updates folded per codec");
  app.add_option("--python", python, "Python with numpy for the Flower-style peer (empty: skip)");
  app.add_option("--peer", peer, "The Flower-style peer script");
  app.add_option("--flower-updates", flower_updates,
                 "Updates the numpy peer aggregates (Flower holds them all in memory, twice)");
  app.add_option("--compressed-codec", int8_spec, "The compressed codec measured");
  app.add_option("--fold-threads", fold_threads,
                 "Thread counts of the streamed fold (the aggregator's path; server.fold_threads)");
  app.add_option("--rss-params", ro.params, "Model size of the RSS runs");
  app.add_option("--rss-clients", rss_clients, "Clients per round of each RSS run");
  app.add_option("--rss-rounds", ro.rounds, "Rounds of each RSS run");
  app.add_option("--chunk-bytes", ro.chunk_bytes, "Transfer chunk size of the RSS runs");
  app.add_option("--download-window-bytes", ro.download_window_bytes,
                 "Aggregator download window per connection in the RSS runs");
  app.add_option("--download-memory-mb", ro.download_memory_mb,
                 "Aggregator budget for queued model downloads (downloads at once: this / window)");
  app.add_option("--upload-concurrency", ro.upload_concurrency,
                 "Aggregator uploads streaming at once (the others wait for their turn)");
  app.add_option("--upload-memory-mb", ro.upload_memory_mb,
                 "Aggregator budget for uploads in flight held in memory (the rest spills)");
  app.add_option("--spill-dir", ro.spill_dir, "Where uploads beyond the budget wait");
  app.add_flag("--skip-throughput", skip_throughput);
  app.add_flag("--skip-rss", skip_rss);
  app.add_option("--tier-clients", tier_clients, "Clients under the leaves of the tier run");
  app.add_option("--tier-leaves", tier_leaves,
                 "Leaf aggregators of the tier run (and direct clients of its baseline)");
  app.add_flag("--skip-tiers", skip_tiers);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::err);  // thousands of clients would log every step

  struct rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }

  // Forks first, before anything starts threads.
  std::vector<RssResult> rss;
  if (!skip_rss) {
    for (int n : rss_clients) {
      std::fprintf(stderr, "agg_bench: RSS run with %d clients...\n", n);
      rss.push_back(bench_rss(n, ro));
    }
  }

  // The root of a tier: `tier_leaves` direct clients, then as many leaves serving tier_clients.
  std::vector<RssResult> tiers;
  if (!skip_tiers) {
    std::fprintf(stderr, "agg_bench: root with %d direct clients...\n", tier_leaves);
    tiers.push_back(bench_rss(tier_leaves, ro));
    std::fprintf(stderr, "agg_bench: root with %d leaves serving %d clients...\n", tier_leaves,
                 tier_clients);
    tiers.push_back(bench_rss(tier_clients, ro, tier_leaves));
  }

  if (!skip_throughput) {
    nlohmann::json flower = nullptr;
    if (!python.empty()) {
      std::fprintf(stderr, "agg_bench: Flower-style numpy aggregate...\n");
      flower = run_flower(python, peer, params, flower_updates);
    }
    std::fprintf(stderr, "agg_bench: generating %lld parameters...\n",
                 static_cast<long long>(params));
    std::vector<float> delta(static_cast<size_t>(params));
    Rng rng(1);
    for (auto& v : delta) v = static_cast<float>(rng.normal() * 1e-3);
    std::vector<FoldResult> folds;
    for (const std::string& spec : {std::string("identity"), int8_spec}) {
      std::fprintf(stderr, "agg_bench: folding %d %s updates...\n", updates, spec.c_str());
      folds.push_back(bench_fold(spec, params, updates, delta));
      for (int t : fold_threads) {
        std::fprintf(stderr, "agg_bench: stream fold of %s, %d thread(s)...\n", spec.c_str(), t);
        folds.push_back(bench_fold(spec, params, updates, delta, t));
      }
    }
    delta.clear();
    delta.shrink_to_fit();
    const double mc = memcpy_gbps(static_cast<size_t>(params) * 4);
    std::map<int, double> mc_at;  // memcpy GB/s at each fold thread count
    for (int t : fold_threads) {
      mc_at[t] = t == 1 ? mc : memcpy_gbps(static_cast<size_t>(params) * 4, t);
    }

    std::printf("\nAggregation throughput: %d updates of %lld float32 parameters\n", updates,
                static_cast<long long>(params));
    std::printf("%-34s %10s %9s %12s %12s %14s\n", "path", "update MB", "seconds", "input GB/s",
                "fp32 GB/s", "decode GB/s");
    for (const auto& f : folds) {
      // Stream folds: their fp32 GB/s per thread against memcpy's single-thread bandwidth, and
      // the speedup over the same codec's one-thread stream fold.
      const FoldResult* one = nullptr;
      for (const auto& g : folds) {
        if (g.codec == f.codec && g.path == "stream fold 1t") one = &g;
      }
      // Beside a multi-thread fold's speedup, memcpy's on the same threads: the most that
      // memory allows.
      std::string note;
      if (f.path != "fold_bytes") {
        char buf[160];
        if (one && f.threads > 1) {
          std::snprintf(buf, sizeof(buf), "  %.2fx memcpy/thread, %.2fx of 1t (memcpy %dt: %.2fx)",
                        f.param_gbps / f.threads / mc, f.param_gbps / one->param_gbps, f.threads,
                        mc_at[f.threads] / mc);
        } else {
          std::snprintf(buf, sizeof(buf), "  %.2fx memcpy/thread", f.param_gbps / f.threads / mc);
        }
        note = buf;
      }
      std::printf(
          "%-34s %10.1f %9.2f %12.2f %12.2f %14s%s\n",
          ("starling " + f.path + " " + f.codec).c_str(), f.update_mb, f.seconds, f.input_gbps,
          f.param_gbps,
          f.path == "fold_bytes" ? std::to_string(f.decode_only_gbps).substr(0, 5).c_str() : "-",
          note.c_str());
    }
    if (flower.is_object()) {
      std::printf("%-34s %10.1f %9.2f %12.2f %12.2f %14s\n",
                  ("Flower aggregate (numpy, " + std::to_string(flower_updates) + " upd)").c_str(),
                  flower.value("update_mb", 0.0), flower.value("seconds", 0.0),
                  flower.value("input_gbps", 0.0), flower.value("input_gbps", 0.0), "-");
    } else {
      std::printf("%-34s (not run: pass --python, see bench/agg_bench.sh)\n", "Flower aggregate");
    }
    for (const auto& [t, gbps] : mc_at) {
      std::printf("%-34s %10.1f %9s %12.2f\n",
                  ("memcpy " + std::to_string(t) + "t (bytes copied)").c_str(),
                  static_cast<double>(params) * 4 / 1e6, "-", gbps);
    }
    if (mc_at.empty()) {
      std::printf("%-34s %10.1f %9s %12.2f\n", "memcpy (bytes copied)",
                  static_cast<double>(params) * 4 / 1e6, "-", mc);
    }
    std::printf(
        "input GB/s: serialized update bytes folded per second (parse + finite check + "
        "decode_add);\nfp32 GB/s: the same in float32 parameter bytes; decode GB/s: decode_add "
        "alone on a parsed update.\n");
  }

  if (!rss.empty()) {
    std::printf(
        "\nAggregator peak RSS, %lld-parameter model (%.1f MiB), %u rounds, upload "
        "memory budget %llu MiB, chunks of %u KiB, download window %zu KiB per "
        "connection and %llu MiB in all, %u uploads at once, loopback mutual TLS\n",
        static_cast<long long>(ro.params), static_cast<double>(ro.params) * 4 / 1048576, ro.rounds,
        static_cast<unsigned long long>(ro.upload_memory_mb), ro.chunk_bytes >> 10,
        ro.download_window_bytes >> 10, static_cast<unsigned long long>(ro.download_memory_mb),
        ro.upload_concurrency);
    std::printf("%-14s %13s %13s %20s %9s %9s %5s\n", "clients/round", "RSS idle MiB",
                "peak RSS MiB", "one round's updates", "uploads", "seconds", "ok");
    for (const auto& r : rss) {
      std::printf("%-14d %13.1f %13.1f %16.1f MiB %9d %9.1f %5s\n", r.clients,
                  static_cast<double>(r.start_kb) / 1024, static_cast<double>(r.peak_kb) / 1024,
                  r.update_mib * r.clients, r.uploads, r.seconds, r.ok ? "yes" : "NO");
    }
    std::printf(
        "RSS idle: listening, before any client; one round's updates: what holding every update "
        "of a round would take.\n");
  }
  if (!tiers.empty()) {
    std::printf(
        "\nRoot of a tier, %lld-parameter model (%.1f MiB), %u rounds, loopback mutual "
        "TLS\n",
        static_cast<long long>(ro.params), static_cast<double>(ro.params) * 4 / 1048576, ro.rounds);
    std::printf("%-28s %9s %13s %13s %18s %15s %9s %5s\n", "setup", "clients", "RSS idle MiB",
                "peak RSS MiB", "root MiB in/round", "updates/round", "seconds", "ok");
    for (const auto& r : tiers) {
      const std::string setup = r.leaves ? std::to_string(r.leaves) + " leaves"
                                         : std::to_string(r.clients) + " direct clients";
      std::printf("%-28s %9d %13.1f %13.1f %18.2f %15.1f %9.1f %5s\n", setup.c_str(), r.clients,
                  static_cast<double>(r.start_kb) / 1024, static_cast<double>(r.peak_kb) / 1024,
                  r.root_bytes_round / 1048576, r.root_updates_round, r.seconds,
                  r.ok ? "yes" : "NO");
    }
    if (tiers.size() == 2 && tiers[0].peak_kb > 0) {
      std::printf(
          "root peak RSS with leaves / with direct clients: %.3f (the root serves leaves, "
          "not devices)\n",
          static_cast<double>(tiers[1].peak_kb) / static_cast<double>(tiers[0].peak_kb));
    }
  }
  return 0;
}
