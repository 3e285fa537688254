// The aggregator's Prometheus metrics and status page, fetched over real loopback HTTP.
#include "aggregator/monitor.h"

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "aggregator/aggregator.h"
#include "tests/testing/loopback.h"

namespace starling::aggregator {
namespace {

using std::chrono::milliseconds;

// Sends `request` to 127.0.0.1:port from another thread while `io` runs here; returns the whole
// response (the server closes after one).
std::string http(asio::io_context& io, uint16_t port, const std::string& request) {
  std::string response;
  std::atomic<bool> done{false};
  std::thread client([&] {
    asio::io_context cio;
    asio::ip::tcp::socket sock(cio);
    asio::error_code ec;
    sock.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
    if (!ec) asio::write(sock, asio::buffer(request), ec);
    if (!ec) {
      std::array<char, 4096> buf;
      for (;;) {
        const size_t n = sock.read_some(asio::buffer(buf), ec);
        response.append(buf.data(), n);
        if (ec) break;
      }
    }
    done = true;
  });
  const bool finished = testing::run_until(io, milliseconds(5000), [&] { return done.load(); });
  client.join();
  REQUIRE(finished);
  return response;
}

std::string get(asio::io_context& io, uint16_t port, const std::string& path) {
  return http(io, port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

TEST_CASE("metrics and the status page are served over HTTP", "[net][monitor]") {
  asio::io_context io;
  auto m = Monitor::start(io, "127.0.0.1", 0, "mnist <federation>");
  REQUIRE(m.ok());
  auto& mon = *m;
  REQUIRE(mon->port() != 0);
  mon->set_registered(12);
  mon->round_started(1, 5);
  mon->bytes_received(1000);
  mon->bytes_received(24);
  for (int i = 0; i < 4; ++i) mon->update_folded();
  mon->update_rejected();
  RoundReport r;
  r.round = 1;
  r.updates = 4;
  r.rejected = 1;
  r.mean_train_loss = 0.75;
  r.seconds = 1.5;
  r.update_bytes = 1024;
  r.dp_epsilon = 0.25;
  r.fold_gbps = 1.25;
  r.receive_gbps = 0.5;
  mon->round_closed(r);
  mon->evaluated(1, 0.5, 0.875);
  mon->client_round_failed("client-3",
                           "round 1 lost: trainer_command (python3) exited with status 3");
  r.round = 2;
  r.mean_train_loss = 0.5;
  mon->round_closed(r);

  const std::string metrics = get(io, mon->port(), "/metrics");
  CHECK_THAT(metrics, Catch::StartsWith("HTTP/1.1 200 OK"));
  CHECK_THAT(metrics, Catch::Contains("Content-Type: text/plain; version=0.0.4"));
  CHECK_THAT(metrics, Catch::Contains("# TYPE starling_rounds_completed_total counter"));
  CHECK_THAT(metrics, Catch::Contains("starling_rounds_completed_total 2"));
  CHECK_THAT(metrics, Catch::Contains("starling_clients_registered 12"));
  CHECK_THAT(metrics, Catch::Contains("starling_clients_selected 5"));
  CHECK_THAT(metrics, Catch::Contains("starling_updates_folded_total 4"));
  CHECK_THAT(metrics, Catch::Contains("starling_updates_rejected_total 1"));
  CHECK_THAT(metrics, Catch::Contains("starling_update_bytes_received_total 1024"));
  CHECK_THAT(metrics, Catch::Contains("starling_train_loss 0.5"));
  CHECK_THAT(metrics, Catch::Contains("starling_eval_accuracy 0.875"));
  CHECK_THAT(metrics, Catch::Contains("starling_dp_epsilon 0.25"));
  CHECK_THAT(metrics, Catch::Contains("starling_round_duration_seconds_count 2"));
  CHECK_THAT(metrics, Catch::Contains("starling_client_round_failures_total 1"));
  CHECK_THAT(metrics, Catch::Contains("starling_fold_gbps 1.25"));
  CHECK_THAT(metrics, Catch::Contains("starling_receive_gbps 0.5"));

  const std::string page = get(io, mon->port(), "/");
  CHECK_THAT(page, Catch::StartsWith("HTTP/1.1 200 OK"));
  CHECK_THAT(page, Catch::Contains("text/html"));
  CHECK_THAT(page, Catch::Contains("mnist &lt;federation&gt;"));  // escaped
  CHECK_THAT(page, Catch::Contains("<svg"));
  CHECK_THAT(page, Catch::Contains("<polyline"));
  CHECK_THAT(page, Catch::Contains("0.8750 (round 1)"));
  CHECK_THAT(page, Catch::Contains("1.00 KiB"));
  CHECK_THAT(page, Catch::Contains("1.25 GB/s folded, 0.500 GB/s received"));

  const std::string json = get(io, mon->port(), "/status.json");
  CHECK_THAT(json, Catch::Contains("\"test_accuracy\":0.875"));
  CHECK_THAT(json, Catch::Contains("\"clients_registered\":12"));
  CHECK_THAT(json, Catch::Contains("client-3: round 1 lost: trainer_command (python3) exited"));
  CHECK_THAT(page, Catch::Contains("rounds lost by clients (latest first)"));

  CHECK_THAT(get(io, mon->port(), "/nope"), Catch::StartsWith("HTTP/1.1 404"));
  CHECK_THAT(http(io, mon->port(), "POST /metrics HTTP/1.1\r\n\r\n"),
             Catch::StartsWith("HTTP/1.1 405"));
  CHECK_THAT(http(io, mon->port(), "garbage\r\n\r\n"), Catch::StartsWith("HTTP/1.1 400"));
  CHECK_THAT(http(io, mon->port(), "GET /" + std::string(9000, 'a')),
             Catch::StartsWith("HTTP/1.1 431"));
  // HEAD: the headers without the body.
  const std::string head = http(io, mon->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK_THAT(head, Catch::StartsWith("HTTP/1.1 200"));
  CHECK(head.find("starling_rounds") == std::string::npos);
}

TEST_CASE("secure aggregation's progress is in the metrics, the page and the JSON", "[monitor]") {
  asio::io_context io;
  auto m = Monitor::start(io, "127.0.0.1", 0, "secure");
  REQUIRE(m.ok());
  auto& mon = *m;

  SECTION("no stage before the first") {
    CHECK_THAT(mon->metrics_text(), Catch::Contains("starling_secagg_stage -1"));
    CHECK_THAT(mon->status_json(), Catch::Contains("\"secagg_stage\":null"));
    CHECK_THAT(mon->status_html(), !Catch::Contains("secure aggregation"));
  }

  SECTION("a secure round") {
    mon->round_started(1, 5);
    mon->secagg_stage(1, 0, 5);
    CHECK_THAT(mon->status_html(),
               Catch::Contains("secure aggregation: stage advertise (5 clients)"));
    mon->secagg_stage(1, 1, 5);
    mon->secagg_stage(1, 2, 4);
    CHECK_THAT(mon->metrics_text(), Catch::Contains("starling_secagg_stage 2"));
    CHECK_THAT(mon->metrics_text(), Catch::Contains("starling_secagg_stage_clients 4"));
    CHECK_THAT(mon->status_html(),
               Catch::Contains("secure aggregation: stage masked_input (4 clients)"));
    CHECK_THAT(mon->status_json(), Catch::Contains("\"secagg_stage\":\"masked_input\""));
    CHECK_THAT(mon->status_json(), Catch::Contains("\"secagg_stage_clients\":4"));
    mon->secagg_stage(1, 3, 4);
    CHECK_THAT(mon->status_html(), Catch::Contains("secure aggregation: stage unmask (4 clients)"));

    RoundReport r;
    r.round = 1;
    r.updates = 3;
    r.secagg_survivors = 3;
    r.secagg_dropped = 1;
    r.secagg_degree = 4;
    r.secagg_threshold = 3;
    r.secagg_stage_bytes = {100, 200, 1234, 56};
    mon->round_closed(r);
    // A second secure round adds to the counters; the gauges are the last round's.
    mon->round_started(2, 5);
    mon->secagg_stage(2, 0, 5);
    r.round = 2;
    r.secagg_survivors = 5;
    r.secagg_dropped = 0;
    r.secagg_degree = 5;
    r.secagg_threshold = 4;
    r.secagg_stage_bytes = {1, 2, 3, 4};
    mon->round_closed(r);

    const std::string metrics = mon->metrics_text();
    CHECK_THAT(metrics, Catch::Contains("# TYPE starling_secagg_bytes_total counter"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_stage -1"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_stage_clients 0"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_survivors_total 8"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_dropped_total 1"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_bytes_total{stage=\"advertise\"} 101"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_bytes_total{stage=\"share_keys\"} 202"));
    CHECK_THAT(metrics,
               Catch::Contains("starling_secagg_bytes_total{stage=\"masked_input\"} 1237"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_bytes_total{stage=\"unmask\"} 60"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_threshold 4"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_degree 5"));

    const std::string page = mon->status_html();
    CHECK_THAT(page, !Catch::Contains("secure aggregation: stage"));
    CHECK_THAT(page, Catch::Contains("5 survivors, 0 dropped (threshold 4, degree 5)"));

    const std::string json = mon->status_json();
    CHECK_THAT(json, Catch::Contains("\"secagg_stage\":null"));
    CHECK_THAT(json, Catch::Contains("\"secagg_survivors\":3"));
    CHECK_THAT(json, Catch::Contains("\"secagg_dropped\":1"));
    CHECK_THAT(json, Catch::Contains("\"secagg_degree\":4"));
    CHECK_THAT(json, Catch::Contains("\"secagg_threshold\":3"));
    CHECK_THAT(json, Catch::Contains("\"secagg_stage_bytes\":[100,200,1234,56]"));
    CHECK_THAT(json, Catch::Contains("\"secagg_stage_bytes\":[1,2,3,4]"));
  }

  SECTION("a round that aborts in a stage does not leave it on the page") {
    mon->round_started(1, 5);
    mon->secagg_stage(1, 1, 5);
    mon->secagg_stage(1, -1, 0);  // the aggregator aborted the round
    CHECK_THAT(mon->status_html(), !Catch::Contains("secure aggregation: stage"));
    CHECK_THAT(mon->status_json(), Catch::Contains("\"secagg_stage\":null"));
    CHECK_THAT(mon->metrics_text(), Catch::Contains("starling_secagg_stage -1"));
    CHECK_THAT(mon->metrics_text(), Catch::Contains("starling_secagg_stage_clients 0"));
    mon->secagg_stage(1, 7, 5);  // no such stage: none either
    CHECK_THAT(mon->status_json(), Catch::Contains("\"secagg_stage\":null"));
    // A stage still shown when another round starts is a leftover.
    mon->secagg_stage(1, 3, 2);
    mon->round_started(2, 5);
    CHECK_THAT(mon->status_html(), !Catch::Contains("secure aggregation: stage"));
    CHECK_THAT(mon->metrics_text(), Catch::Contains("starling_secagg_stage -1"));
    // This round's first stage, reported before round_started, stays.
    mon->secagg_stage(3, 0, 5);
    mon->round_started(3, 5);
    CHECK_THAT(mon->status_html(),
               Catch::Contains("secure aggregation: stage advertise (5 clients)"));
  }

  SECTION("a round without secure aggregation leaves its counters at zero") {
    mon->round_started(1, 5);
    RoundReport r;
    r.round = 1;
    r.updates = 5;
    r.secagg_survivors = 7;  // ignored without a degree
    r.secagg_stage_bytes = {9, 9, 9, 9};
    mon->round_closed(r);
    const std::string metrics = mon->metrics_text();
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_stage -1"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_survivors_total 0"));
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_dropped_total 0"));
    for (const char* stage : {"advertise", "share_keys", "masked_input", "unmask"}) {
      CHECK_THAT(metrics, Catch::Contains("starling_secagg_bytes_total{stage=\"" +
                                          std::string(stage) + "\"} 0"));
    }
    CHECK_THAT(metrics, Catch::Contains("starling_secagg_degree 0"));
    const std::string json = mon->status_json();
    CHECK_THAT(json, !Catch::Contains("secagg_survivors"));
    CHECK_THAT(json, !Catch::Contains("secagg_stage_bytes"));
    CHECK_THAT(mon->status_html(), !Catch::Contains("secure aggregation"));
  }
}

TEST_CASE("a metrics port already taken is a clear error", "[net][monitor]") {
  asio::io_context io;
  auto a = Monitor::start(io, "127.0.0.1", 0, "a");
  REQUIRE(a.ok());
  auto b = Monitor::start(io, "127.0.0.1", (*a)->port(), "b");
  REQUIRE_FALSE(b.ok());
  CHECK_THAT(b.status().message(), Catch::Contains("cannot listen on 127.0.0.1:"));
  CHECK_FALSE(Monitor::start(io, "not-an-ip", 0, "c").ok());
}

}  // namespace
}  // namespace starling::aggregator
