// `starling simulate` end to end: a config (or the embedded default) in, a run folder out
// (config.toml, metrics.jsonl, timing.jsonl, model.safetensors, summary.json, report.html), with
// a progress bar; and sweeps of several configs or of one key's values, compared in a table.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "core/wire/gossip.pb.h"
#include "sim/report.h"

namespace starling::sim {

// The embedded default: Tiny Shakespeare by role, a tiny char GPT, FedAvg with top-k and error
// feedback, over mutual TLS on loopback (configs/sim_default.toml holds the same text).
std::string_view default_config_toml();

// Parses each "KEY=VALUE" as the TOML line `KEY = VALUE` (a bare word that is not a TOML value
// is taken as a string) and merges it over `config`. Errors name the override.
Status apply_overrides(const std::vector<std::string>& sets, google::protobuf::Message* config);

class Ranks;

struct RunOptions {
  std::string out_dir;   // overrides simulate.out_dir when non-empty
  bool progress = true;  // and simulate.progress
  std::FILE* progress_stream = stderr;
  // An MPI job sharing the run (sim/ranks.h; null: one process). Rank 0 writes the run folder,
  // saving the model after every round so a rank that dies leaves the last completed round's
  // model on disk; the other ranks train and write nothing.
  const Ranks* ranks = nullptr;
};

// Runs one simulation into its folder. `source` names the config in errors.
Result<RunSummary> run_simulation(const v1::FederationConfig& config, const std::string& source,
                                  const RunOptions& options);

// A decentralized (gossip) federation (configs/gossip_*.toml) through gossip/'s in-process
// simulation, into the same run folder layout (no model file: every peer has its own) and report:
// train loss, mean test accuracy of the peers and consensus distance against round and bytes.
Result<RunSummary> run_gossip_simulation(const v1::GossipConfig& config, const std::string& source,
                                         const RunOptions& options);

// One labelled config per [sweep] value (label "KEY=VALUE"); just the config (label "") when it
// has no [sweep]. Errors name the key or value at fault.
Result<std::vector<std::pair<std::string, v1::FederationConfig>>> expand_sweep(
    const v1::FederationConfig& config, const std::string& source);

// Runs each config in <out_dir>/<label>, then writes <out_dir>/sweep.html and
// <out_dir>/comparison.txt. REQUIRES: distinct, non-empty labels.
Result<std::vector<RunSummary>> run_sweep(
    const std::vector<std::pair<std::string, v1::FederationConfig>>& runs,
    const std::filesystem::path& out_dir, const RunOptions& options);

// This process's peak resident set (VmHWM), and a reset of it (Linux clear_refs).
uint64_t peak_rss_bytes();
void reset_peak_rss();

}  // namespace starling::sim
