// Prometheus metrics, the status page, and the small HTTP server that serves them. The server
// runs on the aggregator's io_context (one thread, no locks) rather than prometheus-cpp's
// civetweb Exposer, which brings its own threads and cannot serve the status page.
#include "aggregator/monitor.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <istream>
#include <nlohmann/json.hpp>
#include <optional>

#include "aggregator/aggregator.h"

namespace starling::aggregator {
namespace {

using asio::ip::tcp;

constexpr size_t kMaxRequestHead = 8 * 1024;
constexpr auto kConnectionDeadline = std::chrono::seconds(5);
constexpr size_t kMaxHistory = 100'000;  // rounds kept for the page; older ones are dropped
constexpr size_t kMaxChartPoints = 400;
// Secure aggregation's stages, in order: the `stage` label and the names on the page and in JSON.
constexpr std::array<const char*, 4> kSecAggStages = {"advertise", "share_keys", "masked_input",
                                                      "unmask"};

struct RoundPoint {
  uint64_t round = 0;
  int updates = 0;
  int rejected = 0;
  uint64_t bytes = 0;
  double seconds = 0.0;
  double train_loss = 0.0;
  double dp_epsilon = 0.0;
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;
  double fold_gbps = 0.0;     // update bytes folded per second of fold time
  double receive_gbps = 0.0;  // update bytes received per second of the round
  int secagg_survivors = 0;
  int secagg_dropped = 0;
  int secagg_degree = 0;  // 0: not a secure round
  int secagg_threshold = 0;
  std::array<uint64_t, 4> secagg_stage_bytes{};
};

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

// One line chart (x: round) as inline SVG; each series is (round, value) points, drawn in order.
struct Series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;
};

std::string svg_chart(const std::string& title, const std::vector<Series>& series) {
  constexpr double kW = 560, kH = 220, kL = 50, kR = 10, kT = 24, kB = 28;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series) {
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(static_cast<int>(kW)) + "\" height=\"" +
                    std::to_string(static_cast<int>(kH)) + "\" role=\"img\" aria-label=\"" +
                    html_escape(title) + "\">";
  svg += "<text x=\"" + std::to_string(static_cast<int>(kL)) + "\" y=\"16\" font-size=\"13\">" +
         html_escape(title) + "</text>";
  svg += "<rect x=\"50\" y=\"24\" width=\"500\" height=\"168\" fill=\"none\" stroke=\"#999\"/>";
  if (!std::isfinite(x0)) return svg + "<text x=\"60\" y=\"110\">no data yet</text></svg>";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    y1 += 0.5;
    y0 -= 0.5;
  }
  auto px = [&](double x) { return kL + (x - x0) / (x1 - x0) * (kW - kL - kR); };
  auto py = [&](double y) { return kT + (y1 - y) / (y1 - y0) * (kH - kT - kB); };
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "<text x=\"4\" y=\"%.0f\" font-size=\"11\">%.4g</text><text x=\"4\" y=\"%.0f\" "
                "font-size=\"11\">%.4g</text>",
                kT + 10, y1, kH - kB, y0);
  svg += buf;
  std::snprintf(buf, sizeof(buf),
                "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">round %.0f</text><text x=\"%.0f\" "
                "y=\"%.0f\" font-size=\"11\" text-anchor=\"end\">round %.0f</text>",
                kL, kH - 8, x0, kW - kR, kH - 8, x1);
  svg += buf;
  double legend_x = kL + 150;
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    svg += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\" points=\"";
    for (auto [x, y] : s.points) {
      std::snprintf(buf, sizeof(buf), "%.1f,%.1f ", px(x), py(y));
      svg += buf;
    }
    svg += "\"/>";
    std::snprintf(buf, sizeof(buf),
                  "<text x=\"%.0f\" y=\"16\" font-size=\"12\" fill=\"%s\">%s</text>", legend_x,
                  s.color.c_str(), html_escape(s.name).c_str());
    svg += buf;
    legend_x += 110;
  }
  return svg + "</svg>";
}

}  // namespace

struct Monitor::Impl {
  Impl(asio::io_context& io_ctx, std::string t)
      : io(io_ctx), acceptor(io_ctx), title(std::move(t)) {
    registry = std::make_shared<prometheus::Registry>();
    auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
      return prometheus::BuildCounter().Name(name).Help(help).Register(*registry).Add({});
    };
    auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
      return prometheus::BuildGauge().Name(name).Help(help).Register(*registry).Add({});
    };
    rounds_completed = &counter("starling_rounds_completed_total", "Rounds completed");
    updates_folded = &counter("starling_updates_folded_total", "Client updates folded");
    updates_rejected = &counter("starling_updates_rejected_total",
                                "Client updates rejected (malformed, non-finite, refused)");
    bytes_rx = &counter("starling_update_bytes_received_total",
                        "Bytes of update chunks received from clients");
    round_gauge = &gauge("starling_round", "Round in progress (1-based)");
    clients_registered = &gauge("starling_clients_registered", "Clients connected and registered");
    clients_selected = &gauge("starling_clients_selected", "Clients selected in the current round");
    round_seconds = &gauge("starling_round_seconds", "Duration of the last completed round");
    fold_gbps =
        &gauge("starling_fold_gbps",
               "Update bytes checked and folded per second of fold time, last round (GB/s)");
    receive_gbps = &gauge("starling_receive_gbps",
                          "Update bytes received per second of the last round (GB/s)");
    train_loss = &gauge("starling_train_loss", "Mean client training loss of the last round");
    eval_loss =
        &gauge("starling_eval_loss", "Test loss of the global model at the last evaluation");
    eval_accuracy = &gauge("starling_eval_accuracy",
                           "Test accuracy of the global model at the last evaluation");
    dp_epsilon = &gauge("starling_dp_epsilon", "Differential privacy budget spent (epsilon)");
    identities_refused =
        &counter("starling_identities_refused_total",
                 "Clients refused by the access policy (allow-list, revoked certificate)");
    handshakes_refused = &counter("starling_handshakes_refused_total",
                                  "TLS handshakes refused (bad, unknown or revoked certificates)");
    client_round_failures =
        &counter("starling_client_round_failures_total",
                 "Rounds a client reported lost to its own training (trainer crashed, timed out, "
                 "returned bad tensors)");
    secagg_stage_gauge = &gauge("starling_secagg_stage",
                                "Secure aggregation stage in progress (0 advertise keys, 1 share "
                                "keys, 2 masked input, 3 unmask); -1: none");
    secagg_stage_clients =
        &gauge("starling_secagg_stage_clients",
               "Clients expected to answer in the secure aggregation stage in progress");
    secagg_survivors = &counter("starling_secagg_survivors_total",
                                "Clients whose masked vector is in a secure round's sum");
    secagg_dropped =
        &counter("starling_secagg_dropped_total",
                 "Clients that shared their keys in a secure round and sent no masked vector");
    auto& secagg_bytes_family = prometheus::BuildCounter()
                                    .Name("starling_secagg_bytes_total")
                                    .Help("Framed bytes of secure aggregation by stage, both ways")
                                    .Register(*registry);
    for (size_t i = 0; i < kSecAggStages.size(); ++i) {
      secagg_bytes[i] = &secagg_bytes_family.Add({{"stage", kSecAggStages[i]}});
    }
    secagg_threshold = &gauge("starling_secagg_threshold",
                              "Secure aggregation threshold of the last secure round");
    secagg_degree = &gauge("starling_secagg_degree",
                           "Secure aggregation graph degree of the last secure round");
    secagg_stage_gauge->Set(-1);
    round_hist = &prometheus::BuildHistogram()
                      .Name("starling_round_duration_seconds")
                      .Help("Round durations")
                      .Register(*registry)
                      .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.5, 1, 2, 5, 10, 30,
                                                                       60, 120, 300, 600});
  }

  asio::io_context& io;
  tcp::acceptor acceptor;
  std::string title;
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Counter* rounds_completed;
  prometheus::Counter* updates_folded;
  prometheus::Counter* updates_rejected;
  prometheus::Counter* bytes_rx;
  prometheus::Gauge* round_gauge;
  prometheus::Gauge* clients_registered;
  prometheus::Gauge* clients_selected;
  prometheus::Gauge* round_seconds;
  prometheus::Gauge* fold_gbps;
  prometheus::Gauge* receive_gbps;
  prometheus::Gauge* train_loss;
  prometheus::Gauge* eval_loss;
  prometheus::Gauge* eval_accuracy;
  prometheus::Gauge* dp_epsilon;
  prometheus::Counter* identities_refused;
  prometheus::Counter* handshakes_refused;
  prometheus::Counter* client_round_failures;
  prometheus::Histogram* round_hist;
  prometheus::Gauge* secagg_stage_gauge;
  prometheus::Gauge* secagg_stage_clients;
  prometheus::Counter* secagg_survivors;
  prometheus::Counter* secagg_dropped;
  std::array<prometheus::Counter*, 4> secagg_bytes{};
  prometheus::Gauge* secagg_threshold;
  prometheus::Gauge* secagg_degree;
  // The latest refusals, newest last: "who: why".
  std::deque<std::string> refused;
  void remember_refusal(std::string text) {
    refused.push_back(std::move(text));
    while (refused.size() > 20) refused.pop_front();
  }
  // The latest rounds clients lost to their training, newest last: "who: why".
  std::deque<std::string> client_failures;

  std::deque<RoundPoint> history;
  uint64_t current_round = 0;
  size_t registered = 0;
  int selected = 0;
  uint64_t total_bytes = 0;
  // The secure aggregation stage in progress (-1: none), its round and expected clients.
  int secagg_stage = -1;
  uint64_t secagg_round = 0;
  int secagg_clients = 0;
  void end_secagg_stage() {
    secagg_stage = -1;
    secagg_clients = 0;
    secagg_stage_gauge->Set(-1);
    secagg_stage_clients->Set(0);
  }
  bool stopped = false;
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();

  void accept(const std::weak_ptr<Monitor>& weak);
};

namespace {

struct HttpConnection : std::enable_shared_from_this<HttpConnection> {
  HttpConnection(tcp::socket s, std::weak_ptr<Monitor> m)
      : socket(std::move(s)),
        timer(socket.get_executor()),
        buf(kMaxRequestHead),
        monitor(std::move(m)) {}

  tcp::socket socket;
  asio::steady_timer timer;
  asio::streambuf buf;
  std::string response;
  std::weak_ptr<Monitor> monitor;

  void start() {
    timer.expires_after(kConnectionDeadline);
    timer.async_wait([self = shared_from_this()](const asio::error_code& ec) {
      if (!ec) self->close();
    });
    asio::async_read_until(
        socket, buf, "\r\n\r\n",
        [self = shared_from_this()](const asio::error_code& ec, size_t) { self->on_head(ec); });
  }

  void close() {
    asio::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    timer.cancel();
  }

  void on_head(const asio::error_code& ec) {
    if (ec == asio::error::not_found) return reply(431, "text/plain", "request head too large\n");
    if (ec) return close();
    std::istream in(&buf);
    std::string method, target, version;
    in >> method >> target >> version;
    if (method.empty() || target.empty() || version.rfind("HTTP/1.", 0) != 0) {
      return reply(400, "text/plain", "malformed request\n");
    }
    if (method != "GET" && method != "HEAD") {
      return reply(405, "text/plain", "only GET is served\n");
    }
    const std::string path = target.substr(0, target.find('?'));
    auto m = monitor.lock();
    if (!m) return reply(503, "text/plain", "aggregator stopped\n");
    if (path == "/metrics") {
      return reply(200, "text/plain; version=0.0.4; charset=utf-8", m->metrics_text(),
                   method == "HEAD");
    }
    if (path == "/" || path == "/status") {
      return reply(200, "text/html; charset=utf-8", m->status_html(), method == "HEAD");
    }
    if (path == "/status.json") {
      return reply(200, "application/json", m->status_json(), method == "HEAD");
    }
    reply(404, "text/plain", "not found: try /metrics or /status\n");
  }

  void reply(int code, const char* type, const std::string& body, bool head_only = false) {
    const char* reason = code == 200   ? "OK"
                         : code == 400 ? "Bad Request"
                         : code == 404 ? "Not Found"
                         : code == 405 ? "Method Not Allowed"
                         : code == 431 ? "Request Header Fields Too Large"
                                       : "Service Unavailable";
    response = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
               "\r\nContent-Length: " + std::to_string(body.size()) +
               "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n";
    if (!head_only) response += body;
    asio::async_write(
        socket, asio::buffer(response),
        [self = shared_from_this()](const asio::error_code&, size_t) { self->close(); });
  }
};

}  // namespace

void Monitor::Impl::accept(const std::weak_ptr<Monitor>& weak) {
  acceptor.async_accept([this, weak](const asio::error_code& ec, tcp::socket socket) {
    auto self = weak.lock();
    if (!self || stopped) return;
    if (!ec) std::make_shared<HttpConnection>(std::move(socket), weak)->start();
    accept(weak);
  });
}

Monitor::Monitor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Monitor::~Monitor() { stop(); }

Result<std::shared_ptr<Monitor>> Monitor::start(asio::io_context& io, const std::string& host,
                                                uint16_t port, std::string title) {
  auto impl = std::make_unique<Impl>(io, std::move(title));
  asio::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) return invalid_argument("metrics server: '" + host + "' is not an IP address");
  const tcp::endpoint ep(address, port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return unavailable("metrics server: cannot listen on " + host + ":" + std::to_string(port) +
                       ": " + ec.message());
  }
  std::shared_ptr<Monitor> m(new Monitor(std::move(impl)));
  m->impl_->accept(m);
  spdlog::info("aggregator: metrics on http://{}:{}/metrics, status page on http://{}:{}/", host,
               m->port(), host, m->port());
  return m;
}

uint16_t Monitor::port() const {
  asio::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void Monitor::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  asio::error_code ignored;
  impl_->acceptor.close(ignored);
}

void Monitor::set_registered(size_t clients) {
  impl_->registered = clients;
  impl_->clients_registered->Set(static_cast<double>(clients));
}

void Monitor::round_started(uint64_t round, int selected) {
  impl_->current_round = round;
  impl_->selected = selected;
  impl_->round_gauge->Set(static_cast<double>(round));
  impl_->clients_selected->Set(selected);
  // A stage left over from an aborted round; the aggregator may also report this round's first
  // stage before round_started, which stays.
  if (impl_->secagg_stage >= 0 && impl_->secagg_round != round) impl_->end_secagg_stage();
}

void Monitor::secagg_stage(uint64_t round, int stage, int clients) {
  if (stage < 0 || stage >= static_cast<int>(kSecAggStages.size())) {
    return impl_->end_secagg_stage();
  }
  impl_->secagg_stage = stage;
  impl_->secagg_round = round;
  impl_->secagg_clients = clients;
  impl_->secagg_stage_gauge->Set(stage);
  impl_->secagg_stage_clients->Set(clients);
}

void Monitor::bytes_received(uint64_t bytes) {
  impl_->total_bytes += bytes;
  impl_->bytes_rx->Increment(static_cast<double>(bytes));
}

void Monitor::update_folded() { impl_->updates_folded->Increment(); }
void Monitor::update_rejected() { impl_->updates_rejected->Increment(); }
void Monitor::identity_refused(const std::string& who, const std::string& why) {
  impl_->identities_refused->Increment();
  impl_->remember_refusal(who + ": " + why);
}
void Monitor::client_round_failed(const std::string& who, const std::string& why) {
  impl_->client_round_failures->Increment();
  impl_->client_failures.push_back(who + ": " + why);
  while (impl_->client_failures.size() > 20) impl_->client_failures.pop_front();
}
void Monitor::handshake_refused(const std::string& error) {
  impl_->handshakes_refused->Increment();
  impl_->remember_refusal(error);
}

void Monitor::round_closed(const RoundReport& r) {
  impl_->rounds_completed->Increment();
  impl_->round_seconds->Set(r.seconds);
  impl_->fold_gbps->Set(r.fold_gbps);
  impl_->receive_gbps->Set(r.receive_gbps);
  impl_->round_hist->Observe(r.seconds);
  impl_->train_loss->Set(r.mean_train_loss);
  impl_->dp_epsilon->Set(r.dp_epsilon);
  RoundPoint p;
  p.round = r.round;
  p.updates = r.updates;
  p.rejected = r.rejected;
  p.bytes = r.update_bytes;
  p.seconds = r.seconds;
  p.train_loss = r.mean_train_loss;
  p.dp_epsilon = r.dp_epsilon;
  p.fold_gbps = r.fold_gbps;
  p.receive_gbps = r.receive_gbps;
  impl_->end_secagg_stage();
  if (r.secagg_degree > 0) {
    impl_->secagg_survivors->Increment(r.secagg_survivors);
    impl_->secagg_dropped->Increment(r.secagg_dropped);
    for (size_t i = 0; i < kSecAggStages.size(); ++i) {
      impl_->secagg_bytes[i]->Increment(static_cast<double>(r.secagg_stage_bytes[i]));
    }
    impl_->secagg_threshold->Set(r.secagg_threshold);
    impl_->secagg_degree->Set(r.secagg_degree);
    p.secagg_survivors = r.secagg_survivors;
    p.secagg_dropped = r.secagg_dropped;
    p.secagg_degree = r.secagg_degree;
    p.secagg_threshold = r.secagg_threshold;
    p.secagg_stage_bytes = r.secagg_stage_bytes;
  }
  impl_->history.push_back(p);
  if (impl_->history.size() > kMaxHistory) impl_->history.pop_front();
}

void Monitor::evaluated(uint64_t round, double loss, double accuracy) {
  impl_->eval_loss->Set(loss);
  impl_->eval_accuracy->Set(accuracy);
  for (auto it = impl_->history.rbegin(); it != impl_->history.rend(); ++it) {
    if (it->round == round) {
      it->eval_loss = loss;
      it->eval_accuracy = accuracy;
      return;
    }
  }
}

std::string Monitor::metrics_text() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

std::string Monitor::status_json() const {
  nlohmann::json rounds = nlohmann::json::array();
  for (const auto& p : impl_->history) {
    nlohmann::json j = {{"round", p.round},
                        {"updates", p.updates},
                        {"rejected", p.rejected},
                        {"update_bytes", p.bytes},
                        {"round_seconds", p.seconds},
                        {"train_loss", p.train_loss},
                        {"dp_epsilon", p.dp_epsilon},
                        {"fold_gbps", p.fold_gbps},
                        {"receive_gbps", p.receive_gbps}};
    if (p.eval_loss) j["test_loss"] = *p.eval_loss;
    if (p.eval_accuracy) j["test_accuracy"] = *p.eval_accuracy;
    if (p.secagg_degree > 0) {
      j["secagg_survivors"] = p.secagg_survivors;
      j["secagg_dropped"] = p.secagg_dropped;
      j["secagg_degree"] = p.secagg_degree;
      j["secagg_threshold"] = p.secagg_threshold;
      j["secagg_stage_bytes"] = p.secagg_stage_bytes;
    }
    rounds.push_back(std::move(j));
  }
  nlohmann::json stage_name = nullptr;
  if (impl_->secagg_stage >= 0) stage_name = kSecAggStages[impl_->secagg_stage];
  return nlohmann::json{{"title", impl_->title},
                        {"round", impl_->current_round},
                        {"clients_registered", impl_->registered},
                        {"clients_selected", impl_->selected},
                        {"bytes_received", impl_->total_bytes},
                        {"refused", impl_->refused},
                        {"client_round_failures", impl_->client_failures},
                        {"secagg_stage", std::move(stage_name)},
                        {"secagg_stage_clients", impl_->secagg_clients},
                        {"rounds", std::move(rounds)}}
      .dump();
}

std::string Monitor::status_html() const {
  const auto& h = impl_->history;
  // Every k-th round, so the chart stays small however long the run.
  const size_t step = std::max<size_t>(1, (h.size() + kMaxChartPoints - 1) / kMaxChartPoints);
  Series train{"train loss", "#d62728", {}};
  Series test_loss{"test loss", "#1f77b4", {}};
  Series acc{"test accuracy", "#2ca02c", {}};
  for (size_t i = 0; i < h.size(); ++i) {
    const auto& p = h[i];
    const auto x = static_cast<double>(p.round);
    if (i % step == 0 || i + 1 == h.size()) train.points.emplace_back(x, p.train_loss);
    if (p.eval_loss) test_loss.points.emplace_back(x, *p.eval_loss);
    if (p.eval_accuracy) acc.points.emplace_back(x, *p.eval_accuracy);
  }
  auto thin = [](Series& s) {
    const size_t k = std::max<size_t>(1, (s.points.size() + kMaxChartPoints - 1) / kMaxChartPoints);
    if (k == 1) return;
    std::vector<std::pair<double, double>> kept;
    for (size_t i = 0; i < s.points.size(); i += k) kept.push_back(s.points[i]);
    kept.push_back(s.points.back());
    s.points = std::move(kept);
  };
  thin(test_loss);
  thin(acc);

  std::string html =
      "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" "
      "content=\"5\"><title>" +
      html_escape(impl_->title) +
      "</title><style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body><h1>" +
      html_escape(impl_->title) + "</h1>";
  if (impl_->secagg_stage >= 0) {
    html += "<p>secure aggregation: stage " + std::string(kSecAggStages[impl_->secagg_stage]) +
            " (" + std::to_string(impl_->secagg_clients) + " clients)</p>";
  }
  html += "<table>";
  auto row = [&](const std::string& k, const std::string& v) {
    html += "<tr><th>" + k + "</th><td>" + html_escape(v) + "</td></tr>";
  };
  char buf[64];
  row("round in progress", std::to_string(impl_->current_round));
  row("rounds completed", std::to_string(h.empty() ? 0 : h.back().round));
  row("clients registered", std::to_string(impl_->registered));
  row("clients selected", std::to_string(impl_->selected));
  row("update bytes received", human_bytes(static_cast<double>(impl_->total_bytes)));
  for (auto it = impl_->refused.rbegin(); it != impl_->refused.rend(); ++it) {
    row(it == impl_->refused.rbegin() ? "refused (latest first)" : "", *it);
  }
  for (auto it = impl_->client_failures.rbegin(); it != impl_->client_failures.rend(); ++it) {
    row(it == impl_->client_failures.rbegin() ? "rounds lost by clients (latest first)" : "", *it);
  }
  if (!h.empty()) {
    std::snprintf(buf, sizeof(buf), "%.4f", h.back().train_loss);
    row("train loss (last round)", buf);
    std::snprintf(buf, sizeof(buf), "%.2f s", h.back().seconds);
    row("last round", buf);
    if (h.back().fold_gbps > 0) {
      std::snprintf(buf, sizeof(buf), "%.2f GB/s folded, %.3f GB/s received", h.back().fold_gbps,
                    h.back().receive_gbps);
      row("update rates (last round)", buf);
    }
    if (h.back().dp_epsilon > 0) {
      std::snprintf(buf, sizeof(buf), "%.4f", h.back().dp_epsilon);
      row("DP epsilon spent", buf);
    }
    if (h.back().secagg_degree > 0) {
      std::snprintf(buf, sizeof(buf), "%d survivors, %d dropped (threshold %d, degree %d)",
                    h.back().secagg_survivors, h.back().secagg_dropped, h.back().secagg_threshold,
                    h.back().secagg_degree);
      row("secure aggregation (last round)", buf);
    }
  }
  for (auto it = h.rbegin(); it != h.rend(); ++it) {
    if (it->eval_accuracy) {
      std::snprintf(buf, sizeof(buf), "%.4f (round %llu)", *it->eval_accuracy,
                    static_cast<unsigned long long>(it->round));
      row("test accuracy", buf);
      break;
    }
  }
  html += "</table><p>";
  html += svg_chart("loss", {train, test_loss});
  html += "</p><p>";
  html += svg_chart("test accuracy", {acc});
  html +=
      "</p><p><a href=\"/metrics\">Prometheus metrics</a> &middot; <a "
      "href=\"/status.json\">JSON</a></p></body></html>";
  return html;
}

}  // namespace starling::aggregator
