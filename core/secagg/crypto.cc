#include "core/secagg/crypto.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace starling::secagg {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct KdfFree {
  void operator()(EVP_KDF* p) const { EVP_KDF_free(p); }
};
struct KdfCtxFree {
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

const uint8_t* bytes(std::string_view s) { return reinterpret_cast<const uint8_t*>(s.data()); }

Result<Pkey> private_key(const Key32& secret) {
  Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, secret.data(), secret.size()));
  if (!k) return internal_error("X25519: cannot load a private key");
  return k;
}

constexpr size_t kNonce = 12;
constexpr size_t kTag = 16;
// Keystream generated per call to EVP_EncryptUpdate.
constexpr size_t kBlockInts = 4096;

// o[i] += k[i] (or -=), mod 2^32, eight lanes at a time (GCC / Clang vector extension: SIMD
// on every target, where -O2's cost model leaves the plain loop scalar).
void add_stream(uint32_t* o, const uint32_t* k, size_t m, bool plus) {
  typedef uint32_t Lanes __attribute__((vector_size(32)));
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    Lanes a, b;
    std::memcpy(&a, o + i, sizeof a);
    std::memcpy(&b, k + i, sizeof b);
    a = plus ? a + b : a - b;
    std::memcpy(o + i, &a, sizeof a);
  }
  for (; i < m; ++i) o[i] = plus ? o[i] + k[i] : o[i] - k[i];
}

}  // namespace

Status random_bytes(std::span<uint8_t> out) {
  if (out.empty()) return ok_status();
  if (RAND_priv_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return internal_error("OpenSSL's DRBG refused to produce random bytes");
  }
  return ok_status();
}

Result<KeyPair> generate_keypair() {
  KeyPair kp;
  RETURN_IF_ERROR(random_bytes(kp.secret));
  ASSIGN_OR_RETURN(kp.public_key, public_key_of(kp.secret));
  return kp;
}

Result<Key32> public_key_of(const Key32& secret) {
  ASSIGN_OR_RETURN(Pkey k, private_key(secret));
  Key32 pub{};
  size_t len = pub.size();
  if (EVP_PKEY_get_raw_public_key(k.get(), pub.data(), &len) != 1 || len != pub.size()) {
    return internal_error("X25519: cannot compute a public key");
  }
  return pub;
}

Result<Key32> agree(const Key32& secret, const Key32& peer_public) {
  ASSIGN_OR_RETURN(Pkey mine, private_key(secret));
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_public.data(),
                                        peer_public.size()));
  if (!peer) return invalid_argument("X25519: not a public key");
  PkeyCtx ctx(EVP_PKEY_CTX_new(mine.get(), nullptr));
  Key32 out{};
  size_t len = out.size();
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(ctx.get(), out.data(), &len) != 1 || len != out.size()) {
    return invalid_argument("X25519: key agreement failed (a small-order public key?)");
  }
  if (std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; })) {
    return invalid_argument("X25519: the agreed secret is zero (a small-order public key)");
  }
  return out;
}

Result<Key32> derive(const Key32& ikm, std::string_view salt, std::string_view info) {
  std::unique_ptr<EVP_KDF, KdfFree> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (!kdf) return internal_error("HKDF is not available in this OpenSSL");
  std::unique_ptr<EVP_KDF_CTX, KdfCtxFree> ctx(EVP_KDF_CTX_new(kdf.get()));
  if (!ctx) return internal_error("HKDF: no context");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(ikm.data()), ikm.size()),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size()),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()), info.size()),
                         OSSL_PARAM_construct_end()};
  Key32 out{};
  if (EVP_KDF_derive(ctx.get(), out.data(), out.size(), params) != 1) {
    return internal_error("HKDF-SHA256 failed");
  }
  return out;
}

Key32 sha256(std::string_view data) {
  Key32 out{};
  SHA256(bytes(data), data.size(), out.data());
  return out;
}

Result<std::string> seal(const Key32& key, std::string_view aad, std::string_view plaintext) {
  std::string out(kNonce + plaintext.size() + kTag, '\0');
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  RETURN_IF_ERROR(random_bytes(std::span<uint8_t>(o, kNonce)));
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int len = 0, fin = 0;
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), o) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &len, bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), o + kNonce, &len, bytes(plaintext),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), o + kNonce + len, &fin) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTag, o + kNonce + plaintext.size()) !=
          1) {
    return internal_error("AES-256-GCM encryption failed");
  }
  return out;
}

Result<std::string> open(const Key32& key, std::string_view aad, std::string_view sealed) {
  if (sealed.size() < kNonce + kTag) {
    return data_loss("a sealed message of " + std::to_string(sealed.size()) +
                     " bytes (at least 28 expected)");
  }
  const size_t n = sealed.size() - kNonce - kTag;
  std::string out(n, '\0');
  const uint8_t* s = bytes(sealed);
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int len = 0, fin = 0;
  uint8_t tag[kTag];
  std::memcpy(tag, s + kNonce + n, kTag);
  if (!ctx || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), s) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &len, bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<uint8_t*>(out.data()), &len, s + kNonce,
                        static_cast<int>(n)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTag, tag) != 1) {
    return internal_error("AES-256-GCM: cannot start decryption");
  }
  if (EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<uint8_t*>(out.data()) + len, &fin) != 1) {
    return data_loss("AES-256-GCM: authentication failed (tampered, or sealed for someone else)");
  }
  return out;
}

Status apply_mask(const Key32& seed, std::string_view session, std::span<uint32_t> v, int sign,
                  uint32_t bits) {
  const MaskSeed one{seed, sign};
  return apply_masks(std::span<const MaskSeed>(&one, 1), session, v, bits);
}

Status apply_masks(std::span<const MaskSeed> masks, std::string_view session, std::span<uint32_t> v,
                   uint32_t bits) {
  // One AES-128-CTR stream per seed, keyed by HKDF(seed, session): key the first 16 bytes,
  // initial counter block the last 16.
  std::vector<CipherCtx> ctx;
  ctx.reserve(masks.size());
  for (const MaskSeed& m : masks) {
    ASSIGN_OR_RETURN(const Key32 k, derive(m.seed, session, "starling secagg mask"));
    CipherCtx c(EVP_CIPHER_CTX_new());
    if (!c ||
        EVP_EncryptInit_ex(c.get(), EVP_aes_128_ctr(), nullptr, k.data(), k.data() + 16) != 1) {
      return internal_error("AES-128-CTR: cannot start the mask PRG");
    }
    ctx.push_back(std::move(c));
  }
  const uint32_t mask = modulus_mask(bits);
  thread_local std::vector<uint32_t> zeros(kBlockInts, 0), stream(kBlockInts);
  for (size_t at = 0; at < v.size(); at += kBlockInts) {
    const size_t m = std::min(kBlockInts, v.size() - at);
    uint32_t* out = v.data() + at;
    for (size_t s = 0; s < masks.size(); ++s) {
      int len = 0;
      if (EVP_EncryptUpdate(ctx[s].get(), reinterpret_cast<uint8_t*>(stream.data()), &len,
                            reinterpret_cast<const uint8_t*>(zeros.data()),
                            static_cast<int>(m * sizeof(uint32_t))) != 1) {
        return internal_error("AES-128-CTR: the mask PRG failed");
      }
      add_stream(out, stream.data(), m, masks[s].sign > 0);
    }
    // Reduce once per block: addition mod 2^32 commutes with the final mod 2^bits.
    if (mask != 0xFFFFFFFFu) {
      for (size_t i = 0; i < m; ++i) out[i] &= mask;
    }
  }
  return ok_status();
}

std::string_view as_view(const Key32& k) {
  return {reinterpret_cast<const char*>(k.data()), k.size()};
}

Result<Key32> key_from(std::string_view b, std::string_view what) {
  if (b.size() != 32) {
    return invalid_argument(std::string(what) + " has " + std::to_string(b.size()) +
                            " bytes, 32 expected");
  }
  Key32 k{};
  std::memcpy(k.data(), b.data(), 32);
  return k;
}

}  // namespace starling::secagg
