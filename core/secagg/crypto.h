// The cryptography of secure aggregation, all through OpenSSL: X25519 key agreement, HKDF-SHA256,
// AES-256-GCM for the shares clients send each other through the aggregator, and the mask PRG
// (AES-128-CTR keystream read as 32-bit integers). Secrets come from OpenSSL's DRBG only.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace starling::secagg {

using Key32 = std::array<uint8_t, 32>;

// Fills `out` from OpenSSL's private DRBG (RAND_priv_bytes).
Status random_bytes(std::span<uint8_t> out);

struct KeyPair {
  Key32 secret{};
  Key32 public_key{};
};

// A fresh X25519 key pair.
Result<KeyPair> generate_keypair();
// The X25519 public key of `secret` (how a reconstructed key is checked against the advertised).
Result<Key32> public_key_of(const Key32& secret);
// The raw X25519 shared secret of `secret` and `peer_public`; the same from either side. An
// all-zero result (a small-order peer key) is an error.
Result<Key32> agree(const Key32& secret, const Key32& peer_public);
// HKDF-SHA256(ikm, salt, info) -> 32 bytes.
Result<Key32> derive(const Key32& ikm, std::string_view salt, std::string_view info);
Key32 sha256(std::string_view data);

// AES-256-GCM: nonce (12 random bytes) || ciphertext || tag (16). `aad` is authenticated, not
// sent. open() fails (DataLoss) on any change to the sealed bytes or the aad.
Result<std::string> seal(const Key32& key, std::string_view aad, std::string_view plaintext);
Result<std::string> open(const Key32& key, std::string_view aad, std::string_view sealed);

// v[i] = v[i] + sign * PRG(seed)[i] mod 2^bits, where PRG(seed) is the AES-128-CTR keystream
// under HKDF(seed, salt = session, info = "starling secagg mask") read as little-endian uint32s.
// Each v[i] must already be < 2^bits. REQUIRES: sign is +1 or -1, 1 <= bits <= 32.
Status apply_mask(const Key32& seed, std::string_view session, std::span<uint32_t> v, int sign,
                  uint32_t bits);

// Several masks at once: v[i] += sum over masks of sign * PRG(seed)[i] mod 2^bits, the same
// as one apply_mask per seed, but block by block (each block of v stays in cache while every
// keystream is added to it).
struct MaskSeed {
  Key32 seed{};
  int sign = +1;
};
Status apply_masks(std::span<const MaskSeed> masks, std::string_view session, std::span<uint32_t> v,
                   uint32_t bits);

inline uint32_t modulus_mask(uint32_t bits) {
  return bits >= 32 ? 0xFFFFFFFFu : ((1u << bits) - 1u);
}

std::string_view as_view(const Key32& k);
// A Key32 from exactly 32 bytes; InvalidArgument naming `what` otherwise.
Result<Key32> key_from(std::string_view bytes, std::string_view what);

}  // namespace starling::secagg
