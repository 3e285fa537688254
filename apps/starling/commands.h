// Subcommands of the `starling` binary. Each file in apps/starling/ registers one command
// family on the root CLI11 app; the command's callback returns the process exit code
// through `exit_code` (0 on success) and prints one clear error line on failure.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace starling::apps {

// Shared state of one invocation.
struct CommandContext {
  int exit_code = 0;
};

// Prints "starling: error: <message>" to stderr and sets the exit code to 1.
void fail(CommandContext& ctx, const std::string& message);

void register_train(CLI::App& app, CommandContext& ctx);       // starling train
void register_sample(CLI::App& app, CommandContext& ctx);      // starling sample
void register_eval(CLI::App& app, CommandContext& ctx);        // starling eval
void register_certs(CLI::App& app, CommandContext& ctx);       // starling certs ...
void register_info(CLI::App& app, CommandContext& ctx);        // starling info
void register_data(CLI::App& app, CommandContext& ctx);        // starling data ...
void register_aggregator(CLI::App& app, CommandContext& ctx);  // starling aggregator
void register_client(CLI::App& app, CommandContext& ctx);      // starling client
void register_peer(CLI::App& app, CommandContext& ctx);        // starling peer
void register_simulate(CLI::App& app, CommandContext& ctx);    // starling simulate
void register_hf(CLI::App& app, CommandContext& ctx);          // starling import hf / export hf

}  // namespace starling::apps
