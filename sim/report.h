// The run report: one self-contained HTML page with inline SVG charts (loss and accuracy against
// round, simulated wall time and bytes sent; per-client participation), the summary and the
// effective config; and the comparison page and table of a sweep.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "sim/engine.h"

namespace starling::sim {

struct RunSummary {
  std::string label;  // the run's name in a sweep
  std::filesystem::path dir;
  std::string mode;
  std::string task;  // SimTask::describe()
  std::string codec;
  int clients = 0;
  int workers = 0;
  uint64_t rounds = 0;
  double final_loss = 0;      // test loss of the last evaluation
  double final_accuracy = 0;  // test accuracy of the last evaluation
  double best_accuracy = 0;
  double real_seconds = 0;
  double sim_seconds = 0;
  uint64_t bytes_total = 0;
  uint64_t peak_rss_bytes = 0;
  // An MPI run: each rank's peak RSS, in rank order (peak_rss_bytes is rank 0's).
  std::vector<uint64_t> rank_peak_rss_bytes;
  ResidualStore::Stats residuals;
  // simulate.central_baseline: the same model trained centrally on as many samples.
  bool has_central = false;
  double central_loss = 0;
  double central_accuracy = 0;
  double central_samples = 0;
  double central_seconds = 0;
};

RunSummary summarize(const SimResult& result);

// A named series of (x, y) points.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

// An SVG line chart, 640x320, linear axes with ticks; each series is a <polyline> with
// data-series="NAME". The <svg> carries data-chart="ID".
std::string svg_line_chart(const std::string& id, const std::string& title,
                           const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series);

std::string render_report(const RunSummary& summary, const std::vector<RoundRecord>& rounds,
                          const std::vector<uint32_t>& participation,
                          const std::string& config_toml);

// Test accuracy (or loss when no run evaluated) of every run against round and bytes.
std::string render_sweep_report(const std::vector<RunSummary>& runs,
                                const std::vector<std::vector<RoundRecord>>& rounds);
// A fixed-width text table, one row per run.
std::string comparison_table(const std::vector<RunSummary>& runs);

std::string format_bytes(double bytes);      // "12.3 MB"
std::string format_seconds(double seconds);  // "1:02:03", "4:05", "6.7 s"

}  // namespace starling::sim
