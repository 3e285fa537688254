// `starling client`: an edge client of a federation (configs/fed_*.toml [client]), and
// `starling client --check`, which validates config, certificates, data, state and the link to
// the aggregator before a device joins.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/fed_task.h"
#include "apps/starling/commands.h"
#include "apps/starling/device_flags.h"
#include "apps/starling/fetch_data.h"
#include "apps/starling/io_loop.h"
#include "core/cuda/device.h"
#include "core/data/data_dir.h"
#include "core/data/local_data.h"
#include "core/data/mnist.h"
#include "core/net/certs.h"
#include "core/net/tls.h"
#include "edge_client/client_state.h"
#include "edge_client/device.h"
#include "edge_client/edge_client.h"
#include "edge_client/exec_trainer.h"
#include "edge_client/fed_config.h"
#include "edge_client/mnist_trainer.h"
#include "edge_client/preflight.h"
#include "sim/external_task.h"
#include "sim/model_kind.h"
#include "sim/task.h"

namespace starling::apps {
namespace {

struct ClientArgs {
  std::string config;
  std::string node_id;
  int partition = -1;
  bool check = false;
  uint32_t check_timeout_s = 10;
  DeviceFlags device;
};

struct Setup {
  v1::FederationConfig cfg;
  net::TlsConfig tls;
  std::string node_id;
  uint32_t partition = 0;
};

Result<Setup> setup(const ClientArgs& args) {
  Setup s;
  ASSIGN_OR_RETURN(s.cfg, aggregator::load_federation_config(args.config));
  RETURN_IF_ERROR(apply_device_flags(args.device, &s.cfg, args.config));
  ASSIGN_OR_RETURN(s.tls, net::load_tls_config(s.cfg.tls().ca(), s.cfg.tls().cert(),
                                               s.cfg.tls().key(), s.cfg.tls().crl()));
  s.node_id = !args.node_id.empty() ? args.node_id : s.cfg.client().node_id();
  if (s.node_id.empty()) {
    ASSIGN_OR_RETURN(auto cert, net::cert_from_pem(s.tls.cert_pem));
    s.node_id = net::cert_identity(cert.get()).common_name;
  }
  s.partition = args.partition >= 0 ? static_cast<uint32_t>(args.partition)
                                    : s.cfg.client().partition_index();
  if (s.partition >= s.cfg.data().num_clients()) {
    return invalid_argument(args.config + ": partition " + std::to_string(s.partition) +
                            " >= data.num_clients " + std::to_string(s.cfg.data().num_clients()));
  }
  return s;
}

// The built-in trainer of this client's model kind (sim/model_kind.h), loading only what this
// client trains on. `describe` receives what was loaded.
Result<std::unique_ptr<edge_client::LocalTrainer>> make_kind_trainer(const ClientArgs& args,
                                                                     const Setup& s,
                                                                     std::string* describe) {
  ASSIGN_OR_RETURN(const sim::ModelKind* kind, sim::model_kind(s.cfg, args.config));
  return kind->make_client_trainer(s.cfg, args.config, s.partition, describe);
}

bool exec_trainer(const Setup& s) { return s.cfg.client().trainer() == v1::FedClientConfig::EXEC; }

// [client] trainer = "exec": the user's program trains each round (edge_client/exec_trainer.h)
// on tensors laid out as the federation's model.
Result<std::unique_ptr<edge_client::LocalTrainer>> make_exec_trainer(const ClientArgs& args,
                                                                     const Setup& s,
                                                                     std::string* describe) {
  ASSIGN_OR_RETURN(auto layout, sim::federation_layout(s.cfg, args.config));
  auto options = edge_client::exec_trainer_options(s.cfg, s.node_id, s.partition);
  ASSIGN_OR_RETURN(const std::string exe, edge_client::resolve_executable(options.command[0]),
                   args.config + ": client.trainer_command");
  int64_t numel = 0;
  for (const auto& t : layout) numel += shape_numel(t.shape);
  std::string command;
  for (const auto& a : options.command) command += (command.empty() ? "" : " ") + a;
  *describe = "exec trainer `" + command + "` (" + exe + "), rounds in " + options.dir.string() +
              ", timeout " + std::to_string(options.timeout.count() / 1000) + " s; model of " +
              std::to_string(layout.size()) + " tensors, " + std::to_string(numel) + " parameters";
  ASSIGN_OR_RETURN(auto trainer, edge_client::ExecTrainer::create(layout, std::move(options)),
                   args.config);
  return std::unique_ptr<edge_client::LocalTrainer>(std::move(trainer));
}

Status run_client(const ClientArgs& args) {
  ASSIGN_OR_RETURN(Setup s, setup(args));
  RETURN_IF_ERROR(fetch_federation_data(s.cfg));
  RETURN_IF_ERROR(sim::check_simulated_trainer(s.cfg, args.config));
  std::string loaded;
  ASSIGN_OR_RETURN(auto trainer, exec_trainer(s) ? make_exec_trainer(args, s, &loaded)
                                                 : make_kind_trainer(args, s, &loaded));
  ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(s.tls, net::TlsSide::kClient));
  auto options = edge_client::edge_client_options(s.cfg, s.node_id, 0, s.partition + 1);
  if (const char* crash = std::getenv("STARLING_CRASH_POINT"); crash && *crash) {
    options.crash_point = crash;  // crash tests only (EdgeClientOptions::crash_point)
  }
  asio::io_context io;
  spdlog::info("client {}: {}, aggregator {}:{}, state {}", s.node_id, loaded, options.connect.host,
               options.connect.port, options.state_path.empty() ? "in memory" : options.state_path);
  edge_client::EdgeClient client(io, ctx, options, *trainer);
  client.start();
  run_while(io, [&] { return client.stopped(); });
  const auto peak = edge_client::peak_rss_bytes();
  const auto t = client.round_times();
  spdlog::info(
      "client {}: {} rounds trained, {} declined, {} lost to the trainer, peak RSS "
      "{:.1f} MiB; rounds took {:.3f} s on average, {:.1f}% of it outside training "
      "(download, encode, upload)",
      s.node_id, client.rounds_trained(), client.rounds_declined(), client.rounds_lost(),
      peak.ok() ? static_cast<double>(*peak) / (1 << 20) : 0.0,
      t.rounds ? t.total_seconds / t.rounds : 0.0,
      t.total_seconds > 0 ? 100.0 * (t.total_seconds - t.train_seconds) / t.total_seconds : 0.0);
  return client.error();
}

// Prints one line per check; returns how many failed.
int run_check(const ClientArgs& args) {
  int failed = 0;
  auto report = [&](const std::string& what, const Status& st, const std::string& detail) {
    if (st.ok()) {
      std::printf("  ok    %-13s %s\n", what.c_str(), detail.c_str());
    } else {
      ++failed;
      std::printf("  FAIL  %-13s %s\n", what.c_str(), st.to_string().c_str());
    }
    std::fflush(stdout);
  };
  std::printf("starling client --check %s\n", args.config.c_str());
  auto s = setup(args);
  if (!s.ok()) {
    report("config", s.status(), "");
    return failed;
  }
  report("config", ok_status(),
         args.config + " (node " + s->node_id + ", partition " + std::to_string(s->partition) +
             " of " + std::to_string(s->cfg.data().num_clients()) + ")");
  auto cert = edge_client::check_node_certificate(s->tls, s->node_id);
  report("certificate", cert.status(), cert.ok() ? *cert : "");

  const bool exec = exec_trainer(*s);
  std::string loaded;
  auto trainer = exec ? make_exec_trainer(args, *s, &loaded) : make_kind_trainer(args, *s, &loaded);
  report(exec ? "trainer" : "data", trainer.status(), loaded);

  const auto options = edge_client::edge_client_options(s->cfg, s->node_id, 0, 1);
  if (trainer.ok() && !exec) {
    // What a round allocates beyond what the trainer holds (its working set), plus the global
    // model, the delta, the decoded download and the codec's residual and encoding: 5 model-sized
    // buffers. An exec trainer's memory is its own process's.
    v1::RoundPlan plan;
    plan.set_batch_size(s->cfg.local().batch_size());
    uint64_t numel = 0;
    for (const auto& t : (*trainer)->layout()) numel += static_cast<uint64_t>(shape_numel(t.shape));
    const uint64_t need = (*trainer)->working_set_bytes(plan) + 5 * numel * 4;
    const Status mem = edge_client::MemoryBudget{options.memory_limit_bytes}.check(need, "a round");
    const auto rss = edge_client::current_rss_bytes();
    report(
        "memory", mem,
        "a round needs about " + std::to_string((need + (1u << 19)) >> 20) + " MiB on top of " +
            std::to_string(rss.ok() ? (*rss + (1u << 19)) >> 20 : 0) + " MiB; limit " +
            (options.memory_limit_bytes ? std::to_string(options.memory_limit_bytes >> 20) + " MiB"
                                        : std::string("none")));
  }

  // The GPUs this device offers, and where the trainer runs ([client] device, --device). A
  // missing GPU that device "cuda" needs fails the trainer's line above; this one informs.
  {
    const bool cuda = s->cfg.client().device() == "cuda";
    const auto& ids = s->cfg.client().gpus();
    const std::string runs =
        !cuda            ? std::string("the client trains on the CPU")
        : ids.size() > 1 ? fmt::format(
                               "the client trains on cuda:{} (data parallel, one rank "
                               "per GPU)",
                               fmt::join(ids, ","))
                         : fmt::format("the client trains on cuda:{}", ids.empty() ? 0u : ids[0]);
    std::string gpus;
    if (!cuda::built_with_cuda()) {
      gpus = "none usable: this starling was built without CUDA; " + runs;
    } else {
      for (const auto& d : cuda::devices()) {
        gpus +=
            fmt::format("{}{}: {}, {:.1f} GiB, compute capability {}.{}", gpus.empty() ? "" : "; ",
                        d.index, d.name, static_cast<double>(d.total_memory) / (1ull << 30),
                        d.compute_major, d.compute_minor);
      }
      gpus = gpus.empty() ? "none visible (no NVIDIA driver or device, or CUDA_VISIBLE_DEVICES "
                            "hides them); " +
                                runs
                          : gpus + "; " + runs;
    }
    report("gpu", ok_status(), gpus);
  }

  if (options.state_path.empty()) {
    report("state", ok_status(), "not kept ([client].state_path = \"none\")");
  } else {
    auto st = edge_client::load_client_state(options.state_path, s->node_id);
    if (st.status().code() == StatusCode::kNotFound) {
      report("state", ok_status(), options.state_path + " (none yet: first start)");
    } else {
      report("state", st.status(),
             st.ok() ? options.state_path + " (" + std::to_string(st->rounds_trained) +
                           " rounds trained)"
                     : "");
    }
  }

  if (options.condition.empty()) {
    report("condition", ok_status(), "none: trains whenever selected");
  } else {
    std::string why;
    auto allowed = options.condition.allows(&why);
    // A condition that refuses now is not a failure: the client waits for it.
    report("condition", allowed.status(),
           allowed.ok() && *allowed ? "allows training now" : "not now: " + why);
  }

  auto ctx = net::make_tls_context(s->tls, net::TlsSide::kClient);
  if (!ctx.ok()) {
    report("aggregator", ctx.status(), "");
  } else {
    auto probe = edge_client::probe_aggregator(*ctx, options.connect, s->node_id,
                                               std::chrono::seconds(args.check_timeout_s));
    report("aggregator", probe.status(), probe.ok() ? *probe + ", Hello exchanged" : "");
  }
  std::printf(failed ? "%d check(s) failed\n" : "all checks passed\n", failed);
  return failed;
}

}  // namespace

void register_client(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<ClientArgs>();
  auto* cmd = app.add_subcommand("client", "Run an edge client of a federation");
  cmd->add_option("-c,--config", args->config, "Federation TOML config (configs/fed_*.toml)")
      ->required();
  cmd->add_option("--node-id", args->node_id,
                  "Our identity (default: [client].node_id, else the certificate's CN)");
  cmd->add_option("--partition", args->partition,
                  "Which data partition to train on (default: [client].partition_index)");
  cmd->add_flag("--check", args->check,
                "Validate config, certificate, data, memory, state file, training condition and "
                "the link to the aggregator, then exit (0: all passed)");
  cmd->add_option("--check-timeout", args->check_timeout_s,
                  "Seconds to wait for the aggregator in --check")
      ->capture_default_str();
  add_device_flags(cmd, &args->device);
  cmd->callback([args, &ctx] {
    if (args->check) {
      if (run_check(*args) != 0) ctx.exit_code = 1;
      return;
    }
    const Status st = run_client(*args);
    if (!st.ok()) fail(ctx, st.to_string());
  });
}

}  // namespace starling::apps
