// SecAgg+ (Bell, Bonawitz, Gascon, Lepoint, Raykova 2020), semi-honest server, as two state
// machines: ClientSession (one client, one round) and ServerSession (the aggregator, one round).
// The transport moves their messages (secagg.proto); neither does I/O.
//
// A round, for clients 0..n-1 on a Harary graph of degree k, threshold t:
//   0. setup -> advertise: each client makes two fresh X25519 key pairs (c: encryption, s: masks)
//      and a self-mask seed b, and sends c_pk, s_pk and SHA-256(b).
//   1. keys -> share_keys: the server sends each client its neighbours' keys (those that
//      advertised, U0). The client Shamir-shares s_sk and b among itself and those neighbours
//      (t of them reconstruct) and seals each neighbour's pair of shares under AES-256-GCM with
//      a key agreed from the c keys; the server routes the ciphertexts (U1: who shared).
//   2. ciphertexts -> masked_input: client j sends y_j = x_j + PRG(b_j) + sum over neighbours i
//      in U1 of (j < i ? +1 : -1) PRG(agree(s_sk_j, s_pk_i)) mod 2^bits. The server keeps only
//      the running sum of the y_j (U2: who sent one).
//   3. unmask_request -> unmask_shares: the server names survivors (U2) and dropped (U1 \ U2);
//      each client reveals, for each neighbour in U1, its share of b if the neighbour survived
//      or of s_sk if it dropped, never both, once per round. With t shares of each, the server
//      removes PRG(b_j) of every survivor and the pairwise masks survivors hold with dropped
//      clients: what remains is the sum of the survivors' x_j, exactly.
//
// What the server holds (the property docs/secagg.md states and tests check): the public keys,
// the routed ciphertexts (sealed for clients), the running sum of masked vectors (one vector;
// each y_j is added as it arrives and its buffer reused), and, in stage 3, the reconstructed
// b of survivors and s_sk of dropped clients. The self masks stay on every surviving y_j until
// the sum, so no single client's x_j is ever in its memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/secagg/crypto.h"
#include "core/secagg/shamir.h"
#include "core/util/status.h"
#include "core/wire/secagg.pb.h"

namespace starling::secagg {

struct Params {
  uint32_t num_clients = 0;
  uint32_t threshold = 0;
  uint32_t degree = 0;
  uint32_t modulus_bits = 32;
  uint64_t vector_length = 0;
  Key32 graph_seed{};

  v1::SecAggParams to_proto() const;
  // InvalidArgument naming the field for anything a round cannot run with.
  static Result<Params> from_proto(const v1::SecAggParams& p);
  Status validate() const;
};

// The parameters of a round of n clients. threshold 0: the smallest secure one,
// floor((degree + 1) / 2) + 1 (a majority of the degree + 1 holders of each secret). degree 0:
// the smallest even degree, at least 2 log2(n), at which a round where each client drops with
// probability `dropout_tolerance` after sharing fails to reconstruct some secret with
// probability at most 1e-6 (n times the binomial tail of a neighbourhood losing its majority);
// every other client (n - 1) when none smaller does. Errors say which [secagg] key cannot hold,
// e.g. a threshold above degree + 1 or at most half of it.
Result<Params> plan_round(uint32_t n, uint32_t threshold, uint32_t degree, uint32_t modulus_bits,
                          uint64_t vector_length, double dropout_tolerance = 0.0);

// The probability that a round of n clients, each dropping independently with probability
// `dropout`, leaves some secret with fewer than `threshold` live holders (a union bound over the
// clients of the binomial tail), for a graph of degree k.
double reconstruction_failure_bound(uint32_t n, uint32_t k, uint32_t threshold, double dropout);

class ClientSession {
 public:
  // Stage 0. Checks the setup (InvalidArgument) and makes the round's keys and seed.
  static Result<std::unique_ptr<ClientSession>> create(uint64_t round,
                                                       const v1::SecAggSetup& setup);
  const v1::SecAggAdvertise& advertise() const { return advertise_; }
  uint32_t index() const { return index_; }
  const Params& params() const { return params_; }

  // Stage 1. Refuses keys of another round, of non-neighbours, repeated, or fewer than t - 1
  // neighbours (the threshold could not hold).
  Result<v1::SecAggShareKeys> share_keys(const v1::SecAggKeys& keys);
  // Stage 2. `input`: vector_length integers < 2^modulus_bits. A ciphertext that does not open
  // (or opens to a malformed pair) is skipped: its sender's shares are not held, and it is
  // counted in undecryptable(). Refuses ciphertexts from non-neighbours or without keys.
  Result<v1::SecAggMaskedInput> masked_input(const v1::SecAggCiphertexts& ciphertexts,
                                             std::span<const uint32_t> input);
  // Stage 3. Refuses (PermissionDenied) a second request, one that lists this client as
  // dropped or not at all, names a neighbour both survivor and dropped or neither, or leaves
  // fewer than t survivors: the honest client's side of "the server never unmasks a client that
  // did not drop".
  Result<v1::SecAggUnmaskShares> unmask(const v1::SecAggUnmaskRequest& request);
  int undecryptable() const { return undecryptable_; }

 private:
  ClientSession() = default;
  Status check_round(uint64_t round, const std::string& session, const char* what) const;

  enum class Stage { kAdvertised, kShared, kMasked, kDone };
  Stage stage_ = Stage::kAdvertised;
  uint64_t round_ = 0;
  std::string session_;
  uint32_t index_ = 0;
  Params params_;
  std::unique_ptr<CommunicationGraph> graph_;
  KeyPair c_, s_;
  Key32 seed_{};
  v1::SecAggAdvertise advertise_;
  std::map<uint32_t, v1::SecAggPeerKeys> peers_;  // U0 neighbours
  std::map<uint32_t, Key32> share_keys_;          // AES-256-GCM keys agreed with them
  // Neighbours in U1 (their ciphertext reached us), with the shares they gave us.
  struct Held {
    std::string s_share;
    std::string b_share;
    bool ok = false;  // opened and well formed
  };
  std::map<uint32_t, Held> held_;
  std::string own_s_share_, own_b_share_;
  int undecryptable_ = 0;
};

class ServerSession {
 public:
  // names[i]: client i's node id, used in every error. `session`: 16 bytes (tests), or empty
  // for fresh random ones.
  static Result<std::unique_ptr<ServerSession>> create(uint64_t round, Params params,
                                                       std::vector<std::string> names,
                                                       std::string session = {});
  const Params& params() const { return params_; }
  const std::string& session() const { return session_; }
  const std::string& name(uint32_t i) const { return names_[i]; }
  v1::SecAggSetup setup(uint32_t index) const;

  // Each receive_* checks the message (round, session, index, stage, duplicates, sizes) and
  // returns an error naming the client when it refuses it; the client is then left out of the
  // stage, and the round goes on if the threshold still holds.
  Status receive_advertise(const v1::SecAggAdvertise& m);
  // Ends stage 0. FailedPrecondition (the round aborts) when fewer than t advertised.
  Status close_advertise();
  // REQUIRES: close_advertise() ok and `index` advertised.
  v1::SecAggKeys keys_for(uint32_t index) const;

  Status receive_share_keys(const v1::SecAggShareKeys& m);
  Status close_share_keys();
  // REQUIRES: close_share_keys() ok and `index` shared.
  v1::SecAggCiphertexts ciphertexts_for(uint32_t index) const;

  // Adds the masked vector to the running sum and forgets it.
  Status receive_masked_input(const v1::SecAggMaskedInput& m);
  // Ends stage 2: FailedPrecondition when fewer than t sent a masked vector (the round aborts
  // and nothing is unmasked).
  Result<v1::SecAggUnmaskRequest> close_masked_input();

  Status receive_unmask_shares(const v1::SecAggUnmaskShares& m);
  // Reconstructs the survivors' seeds and the dropped clients' keys and removes their masks:
  // the sum of the survivors' inputs mod 2^bits. FailedPrecondition (naming the client) when
  // some secret has fewer than t consistent shares.
  Result<std::vector<uint32_t>> finish();

  // U0, U1, U2 and the responders of stage 3, ascending.
  std::vector<uint32_t> advertised() const;
  std::vector<uint32_t> shared() const;
  std::vector<uint32_t> survivors() const;
  std::vector<uint32_t> responders() const;

  // The vectors this session holds and what they contain, for the property test: it is always
  // exactly one, the running sum of masked vectors (or, after finish(), the unmasked sum).
  size_t vectors_held() const { return sum_.empty() ? 0 : 1; }
  std::span<const uint32_t> running_sum() const { return sum_; }

 private:
  ServerSession() = default;
  Status check(uint64_t round, const std::string& session, uint32_t index, const char* what,
               int stage) const;
  Result<Key32> reconstruct(uint32_t owner, bool self_mask);

  uint64_t round_ = 0;
  std::string session_;
  Params params_;
  std::vector<std::string> names_;
  std::unique_ptr<CommunicationGraph> graph_;
  int stage_ = 0;  // 0 advertise, 1 share keys, 2 masked input, 3 unmask, 4 done
  std::map<uint32_t, v1::SecAggPeerKeys> keys_;                  // U0
  std::map<uint32_t, std::vector<v1::SecAggCiphertext>> inbox_;  // by recipient
  std::set<uint32_t> shared_;                                    // U1
  std::set<uint32_t> survivors_;                                 // U2
  std::set<uint32_t> dropped_;                                   // U1 \ U2
  // shares_[owner][self_mask] = (x, share) from the responders.
  std::map<uint32_t, std::vector<std::pair<uint32_t, std::string>>> b_shares_, s_shares_;
  std::set<uint32_t> responders_;
  std::vector<uint32_t> sum_;
  std::vector<uint32_t> scratch_;
};

}  // namespace starling::secagg
