// `starling simulate`: a whole federation on this machine (sim/). With no arguments it runs the
// embedded default (Shakespeare by role, char GPT, top-k with error feedback, loopback TLS);
// several --config files or a [sweep] section run one after another and end with a comparison.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/fed_task.h"
#include "apps/starling/commands.h"
#include "apps/starling/device_flags.h"
#include "apps/starling/fetch_data.h"
#include "core/config/toml_config.h"
#include "gossip/task.h"
#include "sim/ranks.h"
#include "sim/run.h"

namespace starling::apps {
namespace {

struct SimulateArgs {
  std::vector<std::string> configs;
  std::vector<std::string> sets;
  std::string out_dir;
  std::string mode;
  int workers = -1;
  bool quiet = false;
  DeviceFlags device;
};

Result<v1::FederationConfig> load(const std::string& path, const SimulateArgs& args) {
  v1::FederationConfig cfg;
  if (path.empty()) {
    RETURN_IF_ERROR(config::parse_toml(sim::default_config_toml(), "<default simulation>", &cfg));
  } else {
    RETURN_IF_ERROR(config::load_toml(path, &cfg));
  }
  RETURN_IF_ERROR(sim::apply_overrides(args.sets, &cfg));
  if (!args.mode.empty()) {
    if (args.mode == "in-process") {
      cfg.mutable_simulate()->set_mode(v1::FedSimulateConfig::IN_PROCESS);
    } else if (args.mode == "loopback") {
      cfg.mutable_simulate()->set_mode(v1::FedSimulateConfig::LOOPBACK);
    } else {
      return invalid_argument("--mode '" + args.mode + "': expected in-process or loopback");
    }
  }
  if (args.workers >= 0) cfg.mutable_simulate()->set_workers(static_cast<uint32_t>(args.workers));
  RETURN_IF_ERROR(aggregator::validate_federation_config(cfg, path.empty() ? "<default>" : path));
  RETURN_IF_ERROR(apply_device_flags(args.device, &cfg, path.empty() ? "<default>" : path));
  return cfg;
}

void print_summary(const sim::RunSummary& s) {
  std::printf("\n%s\n", s.task.c_str());
  std::printf("  %-22s %s, %d clients, %d worker%s\n", "mode", s.mode.c_str(), s.clients, s.workers,
              s.workers == 1 ? "" : "s");
  std::printf("  %-22s %llu\n", "rounds", static_cast<unsigned long long>(s.rounds));
  if (!std::isnan(s.final_accuracy)) {  // an EXTERNAL model may be evaluated by loss alone
    std::printf("  %-22s %.4f (best %.4f)\n", "test accuracy", s.final_accuracy, s.best_accuracy);
  }
  std::printf("  %-22s %.4f\n", "test loss", s.final_loss);
  if (s.has_central) {
    std::printf("  %-22s %.4f test loss, %.4f accuracy (one trainer, the same %.0f samples, %s)\n",
                "central baseline", s.central_loss, s.central_accuracy, s.central_samples,
                sim::format_seconds(s.central_seconds).c_str());
    std::printf("  %-22s %+.1f%% test loss against central\n", "federated gap",
                100.0 * (s.final_loss - s.central_loss) / s.central_loss);
  }
  std::printf("  %-22s %s (codec %s)\n", "bytes sent",
              sim::format_bytes(double(s.bytes_total)).c_str(), s.codec.c_str());
  std::printf("  %-22s %s\n", "simulated wall time", sim::format_seconds(s.sim_seconds).c_str());
  std::printf("  %-22s %s\n", "real wall time", sim::format_seconds(s.real_seconds).c_str());
  std::printf("  %-22s %s\n", "peak RSS", sim::format_bytes(double(s.peak_rss_bytes)).c_str());
  if (s.rank_peak_rss_bytes.size() > 1) {
    std::string per_rank;
    for (size_t r = 0; r < s.rank_peak_rss_bytes.size(); ++r) {
      per_rank += (r ? ", " : "") + std::to_string(r) + ": " +
                  sim::format_bytes(double(s.rank_peak_rss_bytes[r]));
    }
    std::printf("  %-22s %zu ranks; peak RSS per rank %s\n", "MPI", s.rank_peak_rss_bytes.size(),
                per_rank.c_str());
  }
  std::printf("  %-22s %s/report.html\n", "report", s.dir.string().c_str());
  if (std::filesystem::exists(s.dir / "model.safetensors")) {
    std::printf("  %-22s %s/model.safetensors\n", "model", s.dir.string().c_str());
  }
}

// A file that is not a federation config but is a gossip config runs gossip/'s simulation.
Result<bool> is_gossip_config(const std::string& path) {
  if (path.empty()) return false;
  v1::FederationConfig fed;
  const Status as_fed = config::load_toml(path, &fed);
  if (as_fed.ok()) return false;
  v1::GossipConfig gossip;
  if (config::load_toml(path, &gossip).ok()) return true;
  return as_fed;
}

Status run_gossip(const std::string& path, const SimulateArgs& args) {
  v1::GossipConfig cfg;
  RETURN_IF_ERROR(config::load_toml(path, &cfg));
  RETURN_IF_ERROR(sim::apply_overrides(args.sets, &cfg));
  RETURN_IF_ERROR(gossip::validate_gossip_config(cfg, path));
  sim::RunOptions o;
  o.progress = !args.quiet;
  o.out_dir = args.out_dir;
  ASSIGN_OR_RETURN(auto s, sim::run_gossip_simulation(cfg, path, o));
  print_summary(s);
  return ok_status();
}

// `mpirun -n R starling simulate -c CONFIG`: every rank runs this with the same config and
// shares each round's clients (sim/ranks.h); rank 0 writes the run folder and prints.
Status run_ranks(const SimulateArgs& args, const sim::Ranks& ranks) {
  if (args.configs.size() != 1) {
    return invalid_argument("under mpirun, `starling simulate` takes exactly one --config");
  }
  const std::string& path = args.configs[0];
  ASSIGN_OR_RETURN(const bool gossip, is_gossip_config(path));
  if (gossip) return invalid_argument(path + ": gossip simulations run in one process");
  ASSIGN_OR_RETURN(auto cfg, load(path, args));
  ASSIGN_OR_RETURN(auto expanded, sim::expand_sweep(cfg, path));
  if (expanded.size() != 1) return invalid_argument(path + ": a [sweep] runs in one process");
  // Rank 0 fetches a missing dataset; the others wait for it (and hear when it failed).
  Status fetched = ranks.root() ? fetch_federation_data(cfg) : Status();
  ASSIGN_OR_RETURN(auto said, ranks.allgather(fetched.ok() ? "" : fetched.to_string()));
  if (!said[0].empty()) return failed_precondition("rank 0: " + said[0]);
  sim::RunOptions o;
  o.progress = !args.quiet;
  o.out_dir = args.out_dir;
  o.ranks = &ranks;
  ASSIGN_OR_RETURN(auto s, sim::run_simulation(cfg, path, o));
  if (ranks.root()) print_summary(s);
  return ok_status();
}

Status run(const SimulateArgs& args) {
  ASSIGN_OR_RETURN(auto ranks, sim::Ranks::init());
  if (ranks->size() > 1) {
    // Only rank 0 speaks at info level; the others report warnings and errors.
    if (!ranks->root() && spdlog::get_level() <= spdlog::level::info) {
      spdlog::set_level(spdlog::level::warn);
    }
    const Status st = run_ranks(args, *ranks);
    if (!st.ok()) {
      // Another rank may be waiting in a collective: end the whole job, naming this rank.
      std::fprintf(stderr, "error: rank %d of %d: %s\n", ranks->rank(), ranks->size(),
                   st.to_string().c_str());
      std::fflush(stderr);
      ranks->abort(1);
    }
    return st;
  }
  std::vector<std::string> paths = args.configs;
  if (paths.empty()) paths.push_back("");
  if (paths.size() == 1) {
    ASSIGN_OR_RETURN(const bool gossip, is_gossip_config(paths[0]));
    if (gossip) return run_gossip(paths[0], args);
  }
  std::vector<std::pair<std::string, v1::FederationConfig>> runs;
  for (const auto& p : paths) {
    ASSIGN_OR_RETURN(auto cfg, load(p, args));
    const std::string source = p.empty() ? "<default>" : p;
    ASSIGN_OR_RETURN(auto expanded, sim::expand_sweep(cfg, source));
    for (auto& [label, c] : expanded) {
      std::string name = std::filesystem::path(source).stem().string();
      if (paths.size() == 1 && !label.empty())
        name = label;
      else if (!label.empty())
        name += "_" + label;
      runs.emplace_back(name, std::move(c));
    }
  }
  for (const auto& [name, c] : runs) RETURN_IF_ERROR(fetch_federation_data(c));
  sim::RunOptions o;
  o.progress = !args.quiet;
  if (runs.size() == 1) {
    o.out_dir = args.out_dir;
    ASSIGN_OR_RETURN(
        auto s, sim::run_simulation(runs[0].second, paths[0].empty() ? "<default>" : paths[0], o));
    print_summary(s);
    return ok_status();
  }
  const std::string out = !args.out_dir.empty() ? args.out_dir : "runs/sweep";
  ASSIGN_OR_RETURN(auto all, sim::run_sweep(runs, out, o));
  std::printf("\n%s", sim::comparison_table(all).c_str());
  std::printf("\nreports: %s/<run>/report.html, comparison: %s/sweep.html\n", out.c_str(),
              out.c_str());
  return ok_status();
}

}  // namespace

void register_simulate(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<SimulateArgs>();
  auto* cmd = app.add_subcommand(
      "simulate",
      "Simulate a federation on this machine (default: Shakespeare by role, char GPT, loopback "
      "TLS)");
  cmd->add_option("-c,--config", args->configs,
                  "Federation TOML config(s) with [simulate] (configs/sim_*.toml); several run as "
                  "a sweep; a gossip config (configs/gossip_*.toml) runs a decentralized "
                  "federation. Default: the embedded configs/sim_default.toml");
  cmd->add_option("--set", args->sets,
                  "Override a config key, e.g. --set rounds.num_rounds=5 (repeatable)");
  cmd->add_option("-o,--out", args->out_dir, "Run folder (default: [simulate].out_dir)");
  cmd->add_option("--mode", args->mode, "in-process or loopback (default: [simulate].mode)");
  cmd->add_option("--workers", args->workers, "Training threads (0: the machine's cores)");
  cmd->add_flag("-q,--quiet", args->quiet, "No progress bar");
  add_device_flags(cmd, &args->device);
  cmd->callback([args, &ctx] {
    const Status st = run(*args);
    if (!st.ok()) fail(ctx, st.to_string());
  });
}

}  // namespace starling::apps
