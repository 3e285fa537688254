// Subcommands of the `starling` binary. Each file in apps/starling/ registers one command
// family on the root CLI11 app; the command's callback returns the process exit code
// through `exit_code` (0 on success) and prints one clear error line on failure.
#pragma once

#include <CLI/CLI.hpp>

namespace starling::apps {

// Shared state of one invocation.
struct CommandContext {
  int exit_code = 0;
};

void register_train(CLI::App& app, CommandContext& ctx);   // starling train
void register_sample(CLI::App& app, CommandContext& ctx);  // starling sample
void register_certs(CLI::App& app, CommandContext& ctx);   // starling certs ...

}  // namespace starling::apps
