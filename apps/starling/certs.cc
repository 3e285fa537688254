// `starling certs`: make the federation CA, issue node certificates, revoke them (the CA's
// CRL), show a certificate.
// Private keys are written with mode 0600 and never overwritten.
#include "core/net/certs.h"

#include <openssl/x509.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/starling/commands.h"

namespace starling::apps {
namespace {

namespace fs = std::filesystem;

struct InitCaArgs {
  std::string out;
  std::string name;
  int days = 3650;
};

struct IssueArgs {
  std::string ca;
  std::string name;
  std::string role;
  std::string sans;
  std::string out;
  int days = 365;
};

Status make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return internal_error("cannot create directory " + dir + ": " + ec.message());
  return ok_status();
}

Status refuse_overwrite(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path, ec)) {
    return {StatusCode::kAlreadyExists, path.string() + " exists; remove it first to replace it"};
  }
  return ok_status();
}

// Writes cert (0644) and key (0600) as DIR/STEM.crt and DIR/STEM.key.
Status write_credential(const std::string& dir, const std::string& stem,
                        const net::Credential& cred) {
  const fs::path key_path = fs::path(dir) / (stem + ".key");
  const fs::path cert_path = fs::path(dir) / (stem + ".crt");
  RETURN_IF_ERROR(refuse_overwrite(key_path));
  ASSIGN_OR_RETURN(std::string cert_pem, net::cert_to_pem(cred.cert.get()));
  ASSIGN_OR_RETURN(std::string key_pem, net::key_to_pem(cred.key.get()));
  RETURN_IF_ERROR(net::write_file(key_path.string(), key_pem, 0600));
  RETURN_IF_ERROR(net::write_file(cert_path.string(), cert_pem, 0644));
  std::cout << "wrote " << cert_path.string() << "\nwrote " << key_path.string()
            << " (mode 0600)\n";
  return ok_status();
}

Status init_ca(const InitCaArgs& a) {
  RETURN_IF_ERROR(make_dir(a.out));
  RETURN_IF_ERROR(refuse_overwrite(fs::path(a.out) / "ca.key"));
  net::CertSpec spec;
  spec.common_name = a.name;
  spec.role = net::CertRole::kCa;
  spec.valid_until_s = int64_t{a.days} * 86400;
  ASSIGN_OR_RETURN(net::Credential ca, net::make_ca(spec));
  return write_credential(a.out, "ca", ca);
}

std::vector<std::string> split_sans(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// DIR/ca.crt and DIR/ca.key, checked to belong together.
Result<net::Credential> load_ca(const std::string& dir) {
  const fs::path ca_dir(dir);
  ASSIGN_OR_RETURN(std::string ca_cert_pem, net::read_file((ca_dir / "ca.crt").string()));
  ASSIGN_OR_RETURN(std::string ca_key_pem, net::read_file((ca_dir / "ca.key").string()));
  net::Credential ca;
  ASSIGN_OR_RETURN(ca.cert, net::cert_from_pem(ca_cert_pem), "CA certificate");
  ASSIGN_OR_RETURN(ca.key, net::key_from_pem(ca_key_pem), "CA key");
  if (X509_check_private_key(ca.cert.get(), ca.key.get()) != 1) {
    net::drain_openssl_errors();
    return invalid_argument("ca.key in " + dir + " does not belong to ca.crt");
  }
  return ca;
}

Status issue(const IssueArgs& a) {
  ASSIGN_OR_RETURN(net::CertRole role, net::parse_cert_role(a.role));
  if (role == net::CertRole::kCa) return invalid_argument("use `starling certs init-ca` for a CA");
  ASSIGN_OR_RETURN(net::Credential ca, load_ca(a.ca));
  ASSIGN_OR_RETURN(std::string ca_cert_pem, net::cert_to_pem(ca.cert.get()));
  net::CertSpec spec;
  spec.common_name = a.name;
  spec.role = role;
  spec.sans = split_sans(a.sans);
  spec.valid_until_s = int64_t{a.days} * 86400;
  net::IssueNotes notes;
  ASSIGN_OR_RETURN(net::Credential node, net::issue_cert(ca, spec, &notes));
  if (notes.not_after_capped) {
    std::cerr << "starling certs issue: " << a.name << ".crt is valid until " << notes.not_after
              << ", when the CA expires, not for the " << a.days << " days asked for\n";
  }
  RETURN_IF_ERROR(make_dir(a.out));
  RETURN_IF_ERROR(write_credential(a.out, a.name, node));
  // Nodes need the CA certificate to verify their peers; put it beside theirs.
  const fs::path ca_copy = fs::path(a.out) / "ca.crt";
  std::error_code ec;
  if (!fs::exists(ca_copy, ec))
    RETURN_IF_ERROR(net::write_file(ca_copy.string(), ca_cert_pem, 0644));
  return ok_status();
}

struct RevokeArgs {
  std::string ca;
  std::vector<std::string> certs;
  std::vector<std::string> serials;
  std::string crl;  // default: CA_DIR/crl.pem
  int days = 30;
};

// Adds certificates (by file or serial) to the CA's revocation list, written atomically; the
// serials it already lists stay. Aggregators and peers with [tls] crl = that file reload it
// within a second, or at once on SIGHUP.
Status revoke(const RevokeArgs& a) {
  // With nothing to add, the list is written again with a fresh validity (a CRL past its
  // nextUpdate makes every handshake fail), or created empty.
  ASSIGN_OR_RETURN(net::Credential ca, load_ca(a.ca));
  const std::string crl_path = a.crl.empty() ? (fs::path(a.ca) / "crl.pem").string() : a.crl;
  std::vector<std::string> serials;
  std::error_code ec;
  if (fs::exists(crl_path, ec)) {
    ASSIGN_OR_RETURN(std::string pem, net::read_file(crl_path));
    ASSIGN_OR_RETURN(net::X509CrlPtr old, net::crl_from_pem(pem), crl_path);
    if (X509_CRL_verify(old.get(), X509_get0_pubkey(ca.cert.get())) != 1) {
      net::drain_openssl_errors();
      return invalid_argument(crl_path + " is not signed by the CA in " + a.ca);
    }
    serials = net::crl_serials(old.get());
  }
  const size_t before = serials.size();
  auto add = [&](const std::string& serial, const std::string& who) {
    if (std::find(serials.begin(), serials.end(), serial) != serials.end()) {
      std::cout << "already revoked: " << serial << who << "\n";
      return;
    }
    serials.push_back(serial);
    std::cout << "revoked " << serial << who << "\n";
  };
  for (const auto& file : a.certs) {
    ASSIGN_OR_RETURN(std::string pem, net::read_file(file));
    ASSIGN_OR_RETURN(net::X509Ptr cert, net::cert_from_pem(pem), file);
    if (X509_verify(cert.get(), X509_get0_pubkey(ca.cert.get())) != 1) {
      net::drain_openssl_errors();
      return invalid_argument(file + " was not issued by the CA in " + a.ca);
    }
    add(net::cert_serial_hex(cert.get()),
        " (CN=" + net::cert_identity(cert.get()).common_name + ")");
  }
  for (std::string serial : a.serials) {
    std::transform(serial.begin(), serial.end(), serial.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    serial.erase(0, std::min(serial.find_first_not_of('0'), serial.size() - 1));
    add(serial, "");
  }
  ASSIGN_OR_RETURN(net::X509CrlPtr crl, net::make_crl_for_serials(ca, serials, a.days));
  ASSIGN_OR_RETURN(std::string pem, net::crl_to_pem(crl.get()));
  RETURN_IF_ERROR(net::write_file(crl_path, pem, 0644));
  std::cout << "wrote " << crl_path << ": " << serials.size() << " revoked certificate(s) ("
            << serials.size() - before << " new), valid " << a.days << " days\n"
            << "aggregators and peers with [tls] crl = \"" << crl_path
            << "\" reload it within a second (or at once: kill -HUP <pid>)\n";
  return ok_status();
}

Status show(const std::string& file) {
  ASSIGN_OR_RETURN(std::string pem, net::read_file(file));
  ASSIGN_OR_RETURN(auto certs, net::certs_from_pem(pem), file);
  for (size_t i = 0; i < certs.size(); ++i) {
    ASSIGN_OR_RETURN(std::string text, net::describe_cert(certs[i].get()));
    if (i > 0) std::cout << "\n";
    std::cout << text;
  }
  return ok_status();
}

int report(const Status& s, std::string_view command) {
  if (s.ok()) return 0;
  std::cerr << "starling certs " << command << ": " << s.to_string() << "\n";
  return 1;
}

}  // namespace

void register_certs(CLI::App& app, CommandContext& ctx) {
  CLI::App* certs = app.add_subcommand(
      "certs", "Federation certificates: make the CA, issue node certificates, show one");
  certs->require_subcommand(1);

  auto init_args = std::make_shared<InitCaArgs>();
  CLI::App* init = certs->add_subcommand("init-ca", "Create the federation CA (ca.crt, ca.key)");
  init->add_option("--out", init_args->out, "Directory for ca.crt and ca.key")->required();
  init->add_option("--name", init_args->name, "Federation name (the CA's common name)")->required();
  init->add_option("--days", init_args->days, "Validity in days")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  init->callback([init_args, &ctx] { ctx.exit_code = report(init_ca(*init_args), "init-ca"); });

  auto issue_args = std::make_shared<IssueArgs>();
  CLI::App* iss = certs->add_subcommand("issue", "Issue a node certificate signed by the CA");
  iss->add_option("--ca", issue_args->ca, "Directory holding ca.crt and ca.key")->required();
  iss->add_option("--name", issue_args->name, "Node identity (the certificate's common name)")
      ->required();
  iss->add_option("--role", issue_args->role,
                  "server, client, peer or leaf (a leaf aggregator: serves its clients and "
                  "uploads to the tier above)")
      ->required()
      ->check(CLI::IsMember({"server", "client", "peer", "leaf"}));
  iss->add_option("--san", issue_args->sans,
                  "Subject alternative names, e.g. DNS:agg.example.org,IP:10.0.0.5");
  iss->add_option("--out", issue_args->out, "Directory for NAME.crt, NAME.key and ca.crt")
      ->required();
  iss->add_option("--days", issue_args->days, "Validity in days")
      ->check(CLI::Range(1, 3650))
      ->capture_default_str();
  iss->callback([issue_args, &ctx] { ctx.exit_code = report(issue(*issue_args), "issue"); });

  auto revoke_args = std::make_shared<RevokeArgs>();
  CLI::App* rev = certs->add_subcommand(
      "revoke",
      "Add certificates to the CA's revocation list (CA_DIR/crl.pem by default); with none, "
      "create the list or renew its validity");
  rev->add_option("--ca", revoke_args->ca, "Directory holding ca.crt and ca.key")->required();
  rev->add_option("--cert", revoke_args->certs, "Certificate file to revoke (repeatable)");
  rev->add_option("--serial", revoke_args->serials,
                  "Serial number to revoke, hex as `starling certs show` prints it (repeatable)");
  rev->add_option("--crl", revoke_args->crl, "Revocation list to update (default CA_DIR/crl.pem)");
  rev->add_option("--days", revoke_args->days, "Validity of the new list in days")
      ->check(CLI::Range(1, 3650))
      ->capture_default_str();
  rev->callback([revoke_args, &ctx] { ctx.exit_code = report(revoke(*revoke_args), "revoke"); });

  auto show_file = std::make_shared<std::string>();
  CLI::App* sh = certs->add_subcommand("show", "Print a certificate (or each in a bundle)");
  sh->add_option("file", *show_file, "PEM certificate file")->required();
  sh->callback([show_file, &ctx] { ctx.exit_code = report(show(*show_file), "show"); });
}

}  // namespace starling::apps
