// The starling command line: one binary, one subcommand per role. Only main() catches.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "apps/starling/commands.h"
#include "core/util/logging.h"

int main(int argc, char** argv) {
  try {
    CLI::App app{"starling: federated and decentralized learning"};
    app.require_subcommand(1);
    std::string log_level = "info";
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
        ->capture_default_str();
    starling::apps::CommandContext ctx;
    app.parse_complete_callback([&]() {
      const auto st = starling::set_log_level(log_level);
      if (!st.ok()) throw CLI::ValidationError("--log-level", st.message());
    });
    starling::apps::register_train(app, ctx);
    starling::apps::register_sample(app, ctx);
    starling::apps::register_eval(app, ctx);
    starling::apps::register_info(app, ctx);
    starling::apps::register_data(app, ctx);
    starling::apps::register_certs(app, ctx);
    starling::apps::register_aggregator(app, ctx);
    starling::apps::register_client(app, ctx);
    starling::apps::register_peer(app, ctx);
    starling::apps::register_simulate(app, ctx);
    starling::apps::register_hf(app, ctx);
    CLI11_PARSE(app, argc, argv);
    return ctx.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "starling: error: %s\n", e.what());
    return 1;
  }
}
