// SHA-256 through OpenSSL's EVP interface.
#include "core/fetch/sha256.h"

#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace starling::fetch {

void Sha256::Free::operator()(evp_md_ctx_st* c) const { EVP_MD_CTX_free(c); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  // Failure here means OpenSSL is out of memory or broken: not a recoverable input error.
  if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("sha256: EVP_DigestInit_ex failed");
  }
}

void Sha256::update(std::string_view bytes) {
  if (!bytes.empty()) EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size());
}

std::string Sha256::final_hex() {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_.get(), md.data(), &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[md[i] >> 4]);
    hex.push_back(kHex[md[i] & 0xf]);
  }
  return hex;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.final_hex();
}

Result<std::string> sha256_file(const std::filesystem::path& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    const int err = errno;
    const std::string msg = path.string() + ": " + std::strerror(err);
    return err == ENOENT ? not_found(msg) : internal_error(msg);
  }
  Sha256 h;
  std::vector<char> buf(1 << 16);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) h.update({buf.data(), n});
  if (std::ferror(f.get())) return internal_error(path.string() + ": read error");
  return h.final_hex();
}

}  // namespace starling::fetch
