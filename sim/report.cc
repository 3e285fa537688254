// HTML and SVG rendering of simulation runs.
#include "sim/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace starling::sim {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

std::string escape(const std::string& s) {
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
        out += c;
    }
  }
  return out;
}

// Round numbers for axis ticks: about `n` steps of 1, 2 or 5 times a power of ten.
double nice_step(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

std::string tick_label(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.1e}", v);
  return fmt::format("{:.4g}", v);
}

Series series_of(const std::vector<RoundRecord>& rounds, const std::string& name,
                 double (*x)(const RoundRecord&), double (*y)(const RoundRecord&),
                 bool only_evaluated) {
  Series s{name, {}};
  for (const auto& r : rounds) {
    if (only_evaluated && !r.evaluated) continue;
    if (std::isnan(y(r))) continue;  // e.g. no accuracy from an EXTERNAL model's evaluator
    s.points.emplace_back(x(r), y(r));
  }
  return s;
}

double by_round(const RoundRecord& r) { return static_cast<double>(r.round); }
double by_sim_time(const RoundRecord& r) { return r.sim_seconds; }
double by_megabytes(const RoundRecord& r) { return static_cast<double>(r.bytes_total) / 1e6; }
double test_acc(const RoundRecord& r) { return r.test_accuracy; }
double test_loss(const RoundRecord& r) { return r.test_loss; }
double train_loss(const RoundRecord& r) { return r.train_loss; }

const char* kStyle = R"(<style>
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1340px;color:#222}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
table{border-collapse:collapse;font-size:14px} td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
pre{background:#f7f7f7;padding:10px;font-size:12px;overflow:auto;max-height:420px}
</style>)";

std::string participation_chart(const std::vector<uint32_t>& p) {
  if (p.size() <= 300) {
    Series s{"participation", {}};
    for (size_t k = 0; k < p.size(); ++k) s.points.emplace_back(static_cast<double>(k), p[k]);
    return svg_line_chart("participation", "Rounds each client's update was folded in", "client",
                          "rounds", {s});
  }
  std::map<uint32_t, uint64_t> hist;
  for (uint32_t v : p) ++hist[v];
  Series s{"participation", {}};
  for (const auto& [v, count] : hist) s.points.emplace_back(v, static_cast<double>(count));
  return svg_line_chart("participation", "Clients by number of rounds folded in",
                        "rounds folded in", "clients", {s});
}

}  // namespace

std::string format_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string format_seconds(double s) {
  if (s < 60) return fmt::format("{:.1f} s", s);
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t < 3600) return fmt::format("{}:{:02}", t / 60, t % 60);
  return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
}

RunSummary summarize(const SimResult& r) {
  RunSummary s;
  s.mode = r.mode;
  s.clients = r.num_clients;
  s.workers = r.workers;
  s.rounds = r.rounds.empty() ? 0 : r.rounds.back().round;
  for (const auto& rec : r.rounds) {
    if (!rec.evaluated) continue;
    s.final_loss = rec.test_loss;
    s.final_accuracy = rec.test_accuracy;
    s.best_accuracy = std::max(s.best_accuracy, rec.test_accuracy);
  }
  s.real_seconds = r.real_seconds;
  s.sim_seconds = r.rounds.empty() ? 0 : r.rounds.back().sim_seconds;
  s.bytes_total = r.rounds.empty() ? 0 : r.rounds.back().bytes_total;
  s.residuals = r.residuals;
  return s;
}

std::string svg_line_chart(const std::string& id, const std::string& title,
                           const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series) {
  const double W = 640, H = 320, L = 64, R = 16, T = 30, B = 44;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  std::string names;
  for (const auto& s : series) names += (names.empty() ? "" : ",") + s.name;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "data-chart=\"{}\" data-series=\"{}\" role=\"img\"><title>{}</title>\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\" stroke=\"#ddd\"/>\n"
      "<text x=\"{}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
      W, H, W, H, escape(id), escape(names), escape(title), L, escape(title));
  const double xs = nice_step(x1 - x0, 6), ys = nice_step(y1 - y0, 5);
  for (double v = std::ceil(x0 / xs) * xs; v <= x1 + 1e-9 * xs; v += xs) {
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/><text "
        "x=\"{0:.1f}\" y=\"{3}\" font-size=\"11\" text-anchor=\"middle\">{4}</text>\n",
        px(v), T, H - B, H - B + 14, tick_label(v));
  }
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-9 * ys; v += ys) {
    o += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/><text "
        "x=\"{3}\" "
        "y=\"{4:.1f}\" font-size=\"11\" text-anchor=\"end\">{5}</text>\n",
        L, py(v), W - R, L - 4, py(v) + 4, tick_label(v));
  }
  o += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/><line x1=\"{0}\" "
      "y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"#444\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" font-size=\"12\" text-anchor=\"middle\">{6}</text>\n"
      "<text x=\"14\" y=\"{7}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 "
      "{7})\">{8}</text>\n",
      L, T, H - B, W - R, (L + W - R) / 2, H - 8, escape(x_label), (T + H - B) / 2,
      escape(y_label));
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    std::string pts;
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    o += fmt::format(
        "<polyline data-series=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "points=\"{}\"><title>{}</title></polyline>\n",
        escape(series[i].name), color, pts, escape(series[i].name));
    o += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"3\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" "
        "font-size=\"11\">{}</text>\n",
        W - R - 170, T + 6 + 14 * static_cast<double>(i), color, W - R - 156,
        T + 10 + 14 * static_cast<double>(i), escape(series[i].name));
  }
  o += "</svg>\n";
  return o;
}

std::string render_report(const RunSummary& s, const std::vector<RoundRecord>& rounds,
                          const std::vector<uint32_t>& participation,
                          const std::string& config_toml) {
  std::string o =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>starling simulate: " +
      escape(s.dir.string()) + "</title>" + kStyle + "</head><body>\n";
  o += "<h1>starling simulate &mdash; " + escape(s.dir.string()) + "</h1>\n<p>" + escape(s.task) +
       "</p>\n";
  o += "<table><tr><th>mode</th><th>clients</th><th>workers</th><th>rounds</th><th>test "
       "accuracy</th><th>test loss</th><th>bytes sent</th><th>simulated time</th><th>real "
       "time</th><th>peak RSS</th></tr>\n";
  o += fmt::format(
      "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4f}</td><td>{:.4f}</td><td>{}</td>"
      "<td>{}</td><td>{}</td><td>{}</td></tr></table>\n",
      escape(s.mode), s.clients, s.workers, s.rounds, s.final_accuracy, s.final_loss,
      format_bytes(static_cast<double>(s.bytes_total)), format_seconds(s.sim_seconds),
      format_seconds(s.real_seconds), format_bytes(static_cast<double>(s.peak_rss_bytes)));
  o += "<p>Codec <code>" + escape(s.codec) +
       fmt::format(
           "</code>; error-feedback residuals: {} clients, peak {} in memory, {} on "
           "disk.</p>\n",
           s.residuals.clients, format_bytes(static_cast<double>(s.residuals.peak_memory_bytes)),
           format_bytes(static_cast<double>(s.residuals.peak_disk_bytes)));
  o += "<h2>Against round</h2><div class=\"charts\">\n";
  o += svg_line_chart("accuracy_vs_round", "Test accuracy", "round", "accuracy",
                      {series_of(rounds, "test_accuracy", by_round, test_acc, true)});
  o += svg_line_chart("loss_vs_round", "Loss", "round", "loss",
                      {series_of(rounds, "train_loss", by_round, train_loss, false),
                       series_of(rounds, "test_loss", by_round, test_loss, true)});
  o += "</div><h2>Against simulated wall time and bytes sent</h2><div class=\"charts\">\n";
  o += svg_line_chart("accuracy_vs_time", "Test accuracy against simulated wall time",
                      "simulated seconds", "accuracy",
                      {series_of(rounds, "test_accuracy", by_sim_time, test_acc, true)});
  o += svg_line_chart("accuracy_vs_bytes", "Test accuracy against bytes sent (both ways)", "MB",
                      "accuracy",
                      {series_of(rounds, "test_accuracy", by_megabytes, test_acc, true)});
  o += svg_line_chart("loss_vs_time", "Test loss against simulated wall time", "simulated seconds",
                      "loss", {series_of(rounds, "test_loss", by_sim_time, test_loss, true)});
  o += svg_line_chart("loss_vs_bytes", "Test loss against bytes sent (both ways)", "MB", "loss",
                      {series_of(rounds, "test_loss", by_megabytes, test_loss, true)});
  o += "</div><h2>Participation</h2><div class=\"charts\">\n" + participation_chart(participation);
  o += "</div><h2>Rounds</h2><table><tr><th>round</th><th>selected</th><th>updates</th><th>"
       "dropped</th><th>stragglers</th><th>train loss</th><th>test accuracy</th><th>bytes "
       "up</th><th>simulated s</th></tr>\n";
  for (const auto& r : rounds) {
    o += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4f}</td><td>{}</td><td>"
        "{}</td><td>{:.1f}</td></tr>\n",
        r.round, r.selected, r.updates, r.dropped, r.stragglers, r.train_loss,
        r.evaluated ? fmt::format("{:.4f}", r.test_accuracy) : std::string("-"),
        format_bytes(static_cast<double>(r.bytes_up)), r.sim_seconds);
  }
  o +=
      "</table>\n<h2>Effective config</h2><pre>" + escape(config_toml) + "</pre>\n</body></html>\n";
  return o;
}

std::string render_sweep_report(const std::vector<RunSummary>& runs,
                                const std::vector<std::vector<RoundRecord>>& rounds) {
  std::vector<Series> acc_round, acc_bytes, acc_time;
  for (size_t i = 0; i < runs.size(); ++i) {
    acc_round.push_back(series_of(rounds[i], runs[i].label, by_round, test_acc, true));
    acc_bytes.push_back(series_of(rounds[i], runs[i].label, by_megabytes, test_acc, true));
    acc_time.push_back(series_of(rounds[i], runs[i].label, by_sim_time, test_acc, true));
  }
  std::string o =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>starling simulate "
      "sweep</title>" +
      std::string(kStyle) + "</head><body>\n<h1>starling simulate &mdash; sweep</h1>\n";
  o += "<pre>" + escape(comparison_table(runs)) + "</pre>\n<div class=\"charts\">\n";
  o += svg_line_chart("sweep_accuracy_vs_round", "Test accuracy", "round", "accuracy", acc_round);
  o += svg_line_chart("sweep_accuracy_vs_bytes", "Test accuracy against bytes sent", "MB",
                      "accuracy", acc_bytes);
  o += svg_line_chart("sweep_accuracy_vs_time", "Test accuracy against simulated wall time",
                      "simulated seconds", "accuracy", acc_time);
  o += "</div>\n<ul>\n";
  for (const auto& r : runs) {
    o += "<li><a href=\"" + escape((std::filesystem::path(r.label) / "report.html").string()) +
         "\">" + escape(r.label) + "</a></li>\n";
  }
  return o + "</ul></body></html>\n";
}

std::string comparison_table(const std::vector<RunSummary>& runs) {
  size_t w = 5;
  for (const auto& r : runs) w = std::max(w, r.label.size());
  std::string o = fmt::format("{:<{}}  {:>6}  {:>8}  {:>8}  {:>8}  {:>10}  {:>10}  {:>10}  {:>9}\n",
                              "run", w, "rounds", "test acc", "best acc", "test loss", "bytes",
                              "sim time", "real time", "peak RSS");
  for (const auto& r : runs) {
    o += fmt::format("{:<{}}  {:>6}  {:>8.4f}  {:>8.4f}  {:>8.4f}  {:>10}  {:>10}  {:>10}  {:>9}\n",
                     r.label, w, r.rounds, r.final_accuracy, r.best_accuracy, r.final_loss,
                     format_bytes(static_cast<double>(r.bytes_total)),
                     format_seconds(r.sim_seconds), format_seconds(r.real_seconds),
                     format_bytes(static_cast<double>(r.peak_rss_bytes)));
  }
  return o;
}

}  // namespace starling::sim
