// SHA-256 of byte streams and files (OpenSSL EVP), as lowercase hex.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "core/util/status.h"

struct evp_md_ctx_st;

namespace starling::fetch {

// Incremental SHA-256. Not thread-safe; one instance per stream.
class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  // The digest of everything passed to update(), as 64 lowercase hex characters. Call once.
  std::string final_hex();

 private:
  struct Free {
    void operator()(evp_md_ctx_st* c) const;
  };
  std::unique_ptr<evp_md_ctx_st, Free> ctx_;
};

std::string sha256_hex(std::string_view bytes);

// Hashes a whole file. Errors: NotFound / Internal naming the path.
Result<std::string> sha256_file(const std::filesystem::path& path);

}  // namespace starling::fetch
