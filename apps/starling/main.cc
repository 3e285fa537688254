// The starling command line: one binary, one subcommand per role.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"starling: federated and decentralized learning"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
