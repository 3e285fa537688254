// Updates past 2 GiB: a generated update stream (fp32 and fp16 segments) sent over mutual TLS on
// loopback through the client's chunk pump, spilled and hashed by the receiver, then folded
// from the spill file into a sum on disk and checked element by element. Prints GB/s of each
// stage and the peak RSS of the process (sender and receiver together) beside what the peers
// do with an update of that size.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/net/certs.h"
#include "tests/testing/large_update.h"

namespace net = starling::net;

namespace {

template <typename T>
T must(starling::Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "update_stream_bench: %s\n", r.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

net::TlsConfig node(const net::Credential& ca, const std::string& name, net::CertRole role) {
  net::CertSpec spec;
  spec.common_name = name;
  spec.role = role;
  spec.sans = {"DNS:localhost", "IP:127.0.0.1"};
  spec.valid_until_s = 86400;
  const net::Credential c = must(net::issue_cert(ca, spec));
  return {must(net::cert_to_pem(ca.cert.get())), must(net::cert_to_pem(c.cert.get())),
          must(net::key_to_pem(c.key.get())), "", true};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"update_stream_bench: an update past 2 GiB over TLS, folded in bounded memory"};
  uint64_t mib = 4200;
  std::string dir = std::filesystem::temp_directory_path().string();
  app.add_option("--mib", mib, "update size in MiB (4200: 4.1 GiB)");
  app.add_option("--dir", dir, "where the spill and sum files go (needs about 2x the size)");
  CLI11_PARSE(app, argc, argv);

  net::CertSpec ca_spec;
  ca_spec.common_name = "bench-federation";
  ca_spec.role = net::CertRole::kCa;
  ca_spec.valid_until_s = 86400;
  const net::Credential ca = must(net::make_ca(ca_spec));
  const auto numel = static_cast<int64_t>((mib << 20) * 2 / 7);
  const auto run =
      starling::testing::run_large_update(node(ca, "aggregator", net::CertRole::kServer),
                                          node(ca, "client-1", net::CertRole::kClient), numel, dir);
  if (!run.status.ok()) {
    std::fprintf(stderr, "update_stream_bench: %s\n", run.status.to_string().c_str());
    return 1;
  }
  const double gb = static_cast<double>(run.payload_bytes) / 1e9;
  std::printf("update: %.2f GB (%lld elements: 3/4 fp32, 1/4 fp16), chunks of 1 MiB\n", gb,
              static_cast<long long>(numel));
  std::printf("| stage | starling | peer |\n|---|---|---|\n");
  std::printf(
      "| TLS transfer, spill and SHA-256 | %.2f GB/s (%.1f s) | one AES-256-GCM core: "
      "4.2 GB/s (REFERENCE.md); Flower/gRPC: refuses a message over 2 GiB |\n",
      gb / run.transfer_seconds, run.transfer_seconds);
  std::printf(
      "| fold from spill into a sum on disk (2 passes) | %.2f GB/s (%.1f s) | protobuf "
      "EncodedUpdate: refuses over 2 GiB |\n",
      gb / run.fold_seconds, run.fold_seconds);
  std::printf(
      "| peak RSS, sender + receiver | %.0f MiB | a whole-message receiver holds >= %.0f "
      "MiB |\n",
      static_cast<double>(run.peak_rss_bytes) / (1 << 20),
      static_cast<double>(run.payload_bytes) / (1 << 20));
  std::printf("| sum elements wrong | %llu | |\n", static_cast<unsigned long long>(run.mismatches));
  return run.mismatches == 0 ? 0 : 1;
}
