// `starling client`: an edge client of a federation (configs/fed_*.toml [client]), and
// `starling client --check`, which validates config, certificates, data, state and the link to
// the aggregator before a device joins.
#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/fed_task.h"
#include "apps/starling/commands.h"
#include "apps/starling/fetch_data.h"
#include "apps/starling/io_loop.h"
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
#include "sim/diffusion_task.h"
#include "sim/external_task.h"
#include "sim/task.h"

namespace starling::apps {
namespace {

struct ClientArgs {
  std::string config;
  std::string node_id;
  int partition = -1;
  bool check = false;
  uint32_t check_timeout_s = 10;
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

// This client's examples only: the partition is computed from the labels, and only its images
// are converted to floats (never the whole training set).
Result<std::shared_ptr<const data::MnistSet>> load_own_examples(const Setup& s,
                                                                std::vector<int64_t>* indices) {
  if (!s.cfg.data().path().empty()) {
    // The device's own labelled images ([data] path): all of them, never uploaded.
    ASSIGN_OR_RETURN(auto own, data::read_local_images(s.cfg.data().path(), 28, 28));
    indices->resize(static_cast<size_t>(own.size()));
    for (size_t i = 0; i < indices->size(); ++i) (*indices)[i] = static_cast<int64_t>(i);
    return std::make_shared<const data::MnistSet>(std::move(own));
  }
  ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(s.cfg.data().data_dir()));
  auto choose = [&](const data::MnistSet& labels) -> Result<std::vector<int64_t>> {
    ASSIGN_OR_RETURN(auto parts, aggregator::make_partition(s.cfg, labels));
    if (parts[s.partition].empty()) {
      return failed_precondition("partition " + std::to_string(s.partition) + " has no examples");
    }
    return std::move(parts[s.partition]);
  };
  ASSIGN_OR_RETURN(auto own,
                   data::load_mnist_split_subset(dir, s.cfg.data().dataset(), true, choose));
  indices->resize(static_cast<size_t>(own.size()));
  for (size_t i = 0; i < indices->size(); ++i) (*indices)[i] = static_cast<int64_t>(i);
  return std::make_shared<const data::MnistSet>(std::move(own));
}

// The trainer of this client's partition for GPT, MDLM and DDPM. A DDPM client loads only its
// own images, as the classifier clients do (the MNIST training split is 188 MB as floats); GPT
// and MDLM clients take their speaking roles from the SimTask's split of Tiny Shakespeare (about
// 1 MB of text in all). `describe` receives what was loaded.
Result<std::unique_ptr<edge_client::LocalTrainer>> make_task_trainer(const ClientArgs& args,
                                                                     const Setup& s,
                                                                     std::string* describe) {
  v1::FederationConfig cfg = s.cfg;
  cfg.mutable_eval()->set_every_rounds(0);  // evaluation is the aggregator's
  if (cfg.model().arch() == v1::FedModelConfig::DDPM) {
    if (!cfg.data().path().empty()) {
      return invalid_argument(args.config + ": data.path is not read by DDPM clients yet; they " +
                              "train on their partition of data.dataset");
    }
    int64_t images = 0;
    ASSIGN_OR_RETURN(auto trainer, sim::make_ddpm_client_trainer(
                                       cfg, args.config, static_cast<int>(s.partition), &images));
    *describe = "partition " + std::to_string(s.partition) + ": " + std::to_string(images) +
                " images of " + cfg.data().dataset() + " (only these loaded), DDPM U-Net";
    return trainer;
  }
  ASSIGN_OR_RETURN(auto task, sim::SimTask::create(cfg, args.config));
  if (!cfg.data().path().empty()) {
    std::string what;
    ASSIGN_OR_RETURN(auto trainer, task->make_local_trainer(cfg.data().path(), &what), args.config);
    *describe = what + "; " + task->describe();
    return trainer;
  }
  if (static_cast<int>(s.partition) >= task->num_clients()) {
    return invalid_argument(args.config + ": partition " + std::to_string(s.partition) +
                            " >= the task's " + std::to_string(task->num_clients()) + " clients (" +
                            task->describe() + ")");
  }
  *describe = task->describe();
  return task->make_trainer(static_cast<int>(s.partition));
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

Status run_task_client(const ClientArgs& args, const Setup& s) {
  std::string loaded;
  ASSIGN_OR_RETURN(auto trainer, exec_trainer(s) ? make_exec_trainer(args, s, &loaded)
                                                 : make_task_trainer(args, s, &loaded));
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
  spdlog::info("client {}: {} rounds trained, {} lost to the trainer, peak RSS {:.1f} MiB",
               s.node_id, client.rounds_trained(), client.rounds_lost(),
               peak.ok() ? static_cast<double>(*peak) / (1 << 20) : 0.0);
  return client.error();
}

Status run_client(const ClientArgs& args) {
  ASSIGN_OR_RETURN(Setup s, setup(args));
  RETURN_IF_ERROR(fetch_federation_data(s.cfg));
  RETURN_IF_ERROR(sim::check_simulated_trainer(s.cfg, args.config));
  if (sim::is_task_model(s.cfg) || exec_trainer(s)) return run_task_client(args, s);
  std::vector<int64_t> indices;
  ASSIGN_OR_RETURN(auto own, load_own_examples(s, &indices));
  edge_client::MnistTrainer trainer(own, std::move(indices), aggregator::trainer_options(s.cfg));
  ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(s.tls, net::TlsSide::kClient));
  auto options = edge_client::edge_client_options(s.cfg, s.node_id, 0, s.partition + 1);
  if (const char* crash = std::getenv("STARLING_CRASH_POINT"); crash && *crash) {
    options.crash_point = crash;  // crash tests only (EdgeClientOptions::crash_point)
  }
  asio::io_context io;
  const std::string source = s.cfg.data().path().empty()
                                 ? "partition " + std::to_string(s.partition)
                                 : "local data " + s.cfg.data().path() + ", never uploaded";
  spdlog::info("client {}: {} ({} examples), aggregator {}:{}, state {}", s.node_id, source,
               own->size(), options.connect.host, options.connect.port,
               options.state_path.empty() ? "in memory" : options.state_path);
  edge_client::EdgeClient client(io, ctx, options, trainer);
  client.start();
  run_while(io, [&] { return client.stopped(); });
  if (auto peak = edge_client::peak_rss_bytes(); peak.ok()) {
    spdlog::info("client {}: {} rounds trained, {} declined, peak RSS {:.1f} MiB", s.node_id,
                 client.rounds_trained(), client.rounds_declined(),
                 static_cast<double>(*peak) / (1 << 20));
  }
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

  std::vector<int64_t> indices;
  const bool exec = exec_trainer(*s);
  if (exec) {
    std::string loaded;
    auto trainer = make_exec_trainer(args, *s, &loaded);
    report("trainer", trainer.status(), loaded);
  } else if (sim::is_task_model(s->cfg)) {
    std::string loaded;
    auto trainer = make_task_trainer(args, *s, &loaded);
    report("data", trainer.status(), loaded);
  }
  auto own = sim::is_task_model(s->cfg) || exec
                 ? Result<std::shared_ptr<const data::MnistSet>>(
                       failed_precondition("not an MNIST-style classifier task"))
                 : load_own_examples(*s, &indices);
  if (!sim::is_task_model(s->cfg) && !exec) {
    report("data", own.status(),
           own.ok() ? std::to_string((*own)->size()) + " examples of " +
                          (s->cfg.data().path().empty()
                               ? s->cfg.data().dataset()
                               : "local data " + s->cfg.data().path() + " (never uploaded)")
                    : "");
  }

  const auto options = edge_client::edge_client_options(s->cfg, s->node_id, 0, 1);
  if (own.ok()) {
    edge_client::MnistTrainer trainer(*own, indices, aggregator::trainer_options(s->cfg));
    v1::RoundPlan plan;
    plan.set_batch_size(s->cfg.local().batch_size());
    uint64_t numel = 0;
    for (const auto& t : trainer.layout()) numel += static_cast<uint64_t>(shape_numel(t.shape));
    const uint64_t need = trainer.working_set_bytes(plan) + 5 * numel * 4;
    const Status mem = edge_client::MemoryBudget{options.memory_limit_bytes}.check(need, "a round");
    const auto rss = edge_client::current_rss_bytes();
    report(
        "memory", mem,
        "a round needs about " + std::to_string((need + (1u << 19)) >> 20) + " MiB on top of " +
            std::to_string(rss.ok() ? (*rss + (1u << 19)) >> 20 : 0) + " MiB; limit " +
            (options.memory_limit_bytes ? std::to_string(options.memory_limit_bytes >> 20) + " MiB"
                                        : std::string("none")));
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
