#include "core/secagg/protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/secagg/quantize.h"
#include "core/util/rng.h"

namespace starling::secagg {
namespace {

constexpr size_t kSessionBytes = 16;
constexpr size_t kPlainBytes = 8 + 2 * kShareBytes;
constexpr size_t kSealedBytes = 12 + kPlainBytes + 16;

void put_u32(std::string& s, uint32_t v) {
  for (int b = 0; b < 4; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int b = 0; b < 4; ++b) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[b])) << (8 * b);
  return v;
}

// What a share ciphertext is bound to: this session and round, and who sent it to whom.
std::string share_aad(const std::string& session, uint64_t round, uint32_t from, uint32_t to) {
  std::string a = "starling secagg shares";
  a += session;
  put_u32(a, static_cast<uint32_t>(round));
  put_u32(a, static_cast<uint32_t>(round >> 32));
  put_u32(a, from);
  put_u32(a, to);
  return a;
}

std::string hex_prefix(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(s.size(), 4); ++i) {
    out.push_back(d[static_cast<uint8_t>(s[i]) >> 4]);
    out.push_back(d[static_cast<uint8_t>(s[i]) & 15]);
  }
  return out;
}

uint32_t effective_degree(uint32_t n, uint32_t degree) { return std::min(degree, n - 1); }

}  // namespace

v1::SecAggParams Params::to_proto() const {
  v1::SecAggParams p;
  p.set_num_clients(num_clients);
  p.set_threshold(threshold);
  p.set_degree(degree);
  p.set_modulus_bits(modulus_bits);
  p.set_vector_length(vector_length);
  p.set_graph_seed(std::string(as_view(graph_seed)));
  return p;
}

Result<Params> Params::from_proto(const v1::SecAggParams& p) {
  Params out;
  out.num_clients = p.num_clients();
  out.threshold = p.threshold();
  out.degree = p.degree();
  out.modulus_bits = p.modulus_bits();
  out.vector_length = p.vector_length();
  ASSIGN_OR_RETURN(out.graph_seed, key_from(p.graph_seed(), "secagg params graph_seed"));
  RETURN_IF_ERROR(out.validate());
  return out;
}

Status Params::validate() const {
  if (num_clients < 2) {
    return invalid_argument("secagg: a round needs at least 2 clients (got " +
                            std::to_string(num_clients) + ")");
  }
  const uint32_t k = effective_degree(num_clients, degree);
  if (k < num_clients - 1 && (k % 2 != 0 || k == 0)) {
    return invalid_argument(
        "secagg.degree " + std::to_string(degree) +
        " must be even and positive (a Harary graph), or at least clients - 1 = " +
        std::to_string(num_clients - 1));
  }
  if (threshold > k + 1) {
    return invalid_argument("secagg.threshold " + std::to_string(threshold) +
                            " exceeds the degree + 1 = " + std::to_string(k + 1) +
                            " clients that hold shares of each secret");
  }
  if (threshold < 2 || 2 * threshold <= k + 1) {
    return invalid_argument(
        "secagg.threshold " + std::to_string(threshold) + " must be more than half of the " +
        std::to_string(k + 1) +
        " holders of each secret (degree + 1), or the server could collect both a survivor's seed "
        "and its key");
  }
  if (modulus_bits < 2 || modulus_bits > 32) {
    return invalid_argument("secagg.modulus_bits must be in [2, 32] (got " +
                            std::to_string(modulus_bits) + ")");
  }
  if (vector_length == 0 || vector_length > (1ull << 32)) {
    return invalid_argument("secagg: vector length " + std::to_string(vector_length) +
                            " (1 to 2^32)");
  }
  return ok_status();
}

double reconstruction_failure_bound(uint32_t n, uint32_t k, uint32_t threshold, double dropout) {
  if (dropout <= 0) return 0.0;
  if (dropout >= 1) return 1.0;
  // A dropped client's key needs `threshold` of its k neighbours alive (a survivor's seed one
  // fewer, as it holds a share itself): P(Binomial(k, 1 - dropout) < threshold).
  double tail = 0;
  for (uint32_t a = 0; a < threshold && a <= k; ++a) {
    const double log_term = std::lgamma(k + 1.0) - std::lgamma(a + 1.0) - std::lgamma(k - a + 1.0) +
                            a * std::log1p(-dropout) + (k - a) * std::log(dropout);
    tail += std::exp(log_term);
  }
  return std::min(1.0, static_cast<double>(n) * tail);
}

Result<Params> plan_round(uint32_t n, uint32_t threshold, uint32_t degree, uint32_t modulus_bits,
                          uint64_t vector_length, double dropout_tolerance) {
  Params p;
  p.num_clients = n;
  if (!(dropout_tolerance >= 0 && dropout_tolerance < 0.5)) {
    return invalid_argument("secagg.dropout_tolerance must be in [0, 0.5) (got " +
                            std::to_string(dropout_tolerance) + ")");
  }
  if (degree == 0 && n >= 2) {
    uint32_t k = std::max<uint32_t>(
        2, 2 * static_cast<uint32_t>(std::ceil(std::log2(static_cast<double>(n)))));
    while (k < n - 1) {
      const uint32_t t = threshold != 0 ? threshold : k / 2 + 1;
      if (reconstruction_failure_bound(n, k, t, dropout_tolerance) <= 1e-6) break;
      k += 2;
    }
    degree = k;
  }
  if (n >= 2) degree = std::min(degree, n - 1);
  p.degree = degree;
  p.threshold = threshold != 0 ? threshold : (degree + 1) / 2 + 1;
  p.modulus_bits = modulus_bits;
  p.vector_length = vector_length;
  RETURN_IF_ERROR(random_bytes(p.graph_seed));
  RETURN_IF_ERROR(p.validate(), "a secure aggregation round of " + std::to_string(n) + " clients");
  return p;
}

// ---------------------------------------------------------------------------------------------
// Client

Result<std::unique_ptr<ClientSession>> ClientSession::create(uint64_t round,
                                                             const v1::SecAggSetup& setup) {
  std::unique_ptr<ClientSession> c(new ClientSession);
  if (setup.round() != round) {
    return invalid_argument("secagg setup for round " + std::to_string(setup.round()) +
                            " in round " + std::to_string(round));
  }
  if (setup.session().size() != kSessionBytes) {
    return invalid_argument("secagg setup: a session id of " +
                            std::to_string(setup.session().size()) + " bytes (16 expected)");
  }
  ASSIGN_OR_RETURN(c->params_, Params::from_proto(setup.params()), "secagg setup");
  if (setup.index() >= c->params_.num_clients) {
    return invalid_argument("secagg setup: index " + std::to_string(setup.index()) + " of " +
                            std::to_string(c->params_.num_clients) + " clients");
  }
  c->round_ = round;
  c->session_ = setup.session();
  c->index_ = setup.index();
  c->graph_ = std::make_unique<CommunicationGraph>(c->params_.num_clients, c->params_.degree,
                                                   c->params_.graph_seed);
  ASSIGN_OR_RETURN(c->c_, generate_keypair());
  ASSIGN_OR_RETURN(c->s_, generate_keypair());
  RETURN_IF_ERROR(random_bytes(c->seed_));
  c->advertise_.set_round(round);
  c->advertise_.set_session(c->session_);
  c->advertise_.set_index(c->index_);
  c->advertise_.set_c_public(std::string(as_view(c->c_.public_key)));
  c->advertise_.set_s_public(std::string(as_view(c->s_.public_key)));
  c->advertise_.set_seed_commitment(std::string(as_view(sha256(as_view(c->seed_)))));
  return c;
}

Status ClientSession::check_round(uint64_t round, const std::string& session,
                                  const char* what) const {
  if (round != round_ || session != session_) {
    return permission_denied(std::string("secagg ") + what + " of round " + std::to_string(round) +
                             " session " + hex_prefix(session) + "... in round " +
                             std::to_string(round_) + " session " + hex_prefix(session_) +
                             "...: refused (replayed or misrouted)");
  }
  return ok_status();
}

Result<v1::SecAggShareKeys> ClientSession::share_keys(const v1::SecAggKeys& keys) {
  if (stage_ != Stage::kAdvertised) {
    return failed_precondition("secagg: neighbour keys after the share stage: refused");
  }
  RETURN_IF_ERROR(check_round(keys.round(), keys.session(), "neighbour keys"));
  std::map<uint32_t, v1::SecAggPeerKeys> peers;
  for (const auto& p : keys.peers()) {
    if (p.index() == index_ || !graph_->adjacent(index_, p.index())) {
      return permission_denied("secagg: keys of client " + std::to_string(p.index()) +
                               ", not a neighbour of client " + std::to_string(index_) +
                               ": refused");
    }
    if (p.c_public().size() != 32 || p.s_public().size() != 32 ||
        p.seed_commitment().size() != 32) {
      return invalid_argument("secagg: malformed keys of client " + std::to_string(p.index()));
    }
    if (p.c_public() == p.s_public()) {
      return invalid_argument("secagg: client " + std::to_string(p.index()) +
                              " advertised the same key twice");
    }
    if (!peers.emplace(p.index(), p).second) {
      return invalid_argument("secagg: keys of client " + std::to_string(p.index()) + " twice");
    }
  }
  if (peers.size() + 1 < params_.threshold) {
    return failed_precondition(
        "secagg: only " + std::to_string(peers.size()) + " neighbours advertised keys; threshold " +
        std::to_string(params_.threshold) + " cannot hold: refusing to share");
  }
  std::vector<uint32_t> xs;
  xs.push_back(index_ + 1);
  for (const auto& [i, p] : peers) xs.push_back(i + 1);
  ASSIGN_OR_RETURN(auto s_shares, shamir_split(s_.secret, params_.threshold, xs));
  ASSIGN_OR_RETURN(auto b_shares, shamir_split(seed_, params_.threshold, xs));
  own_s_share_ = s_shares[0];
  own_b_share_ = b_shares[0];
  v1::SecAggShareKeys out;
  out.set_round(round_);
  out.set_session(session_);
  out.set_index(index_);
  size_t k = 1;
  for (const auto& [i, p] : peers) {
    ASSIGN_OR_RETURN(const Key32 pub, key_from(p.c_public(), "c_public"));
    ASSIGN_OR_RETURN(const Key32 shared, agree(c_.secret, pub),
                     "secagg: agreeing a key with client " + std::to_string(i));
    ASSIGN_OR_RETURN(const Key32 key, derive(shared, session_, "starling secagg shares"));
    share_keys_[i] = key;  // opens what i sends us in the next stage
    std::string plain;
    put_u32(plain, index_);
    put_u32(plain, i);
    plain += s_shares[k];
    plain += b_shares[k];
    ++k;
    auto* ct = out.add_ciphertexts();
    ct->set_from(index_);
    ct->set_to(i);
    ASSIGN_OR_RETURN(*ct->mutable_ciphertext(),
                     seal(key, share_aad(session_, round_, index_, i), plain));
  }
  peers_ = std::move(peers);
  stage_ = Stage::kShared;
  return out;
}

Result<v1::SecAggMaskedInput> ClientSession::masked_input(const v1::SecAggCiphertexts& cts,
                                                          std::span<const uint32_t> input) {
  if (stage_ != Stage::kShared) {
    return failed_precondition("secagg: ciphertexts outside the masking stage: refused");
  }
  RETURN_IF_ERROR(check_round(cts.round(), cts.session(), "ciphertexts"));
  if (input.size() != params_.vector_length) {
    return invalid_argument("secagg: an input of " + std::to_string(input.size()) +
                            " integers; the round masks " + std::to_string(params_.vector_length));
  }
  const uint32_t mask = modulus_mask(params_.modulus_bits);
  std::map<uint32_t, Held> held;
  for (const auto& ct : cts.ciphertexts()) {
    const uint32_t from = ct.from();
    if (ct.to() != index_ || !peers_.count(from)) {
      return permission_denied("secagg: a ciphertext from client " + std::to_string(from) +
                               " to client " + std::to_string(ct.to()) +
                               ", not from a neighbour that advertised keys to client " +
                               std::to_string(index_) + ": refused");
    }
    if (held.count(from)) {
      return invalid_argument("secagg: two ciphertexts from client " + std::to_string(from));
    }
    Held& h = held[from];
    auto opened =
        open(share_keys_.at(from), share_aad(session_, round_, from, index_), ct.ciphertext());
    if (!opened.ok() || opened->size() != kPlainBytes || get_u32(opened->data()) != from ||
        get_u32(opened->data() + 4) != index_) {
      ++undecryptable_;
      continue;
    }
    h.s_share = opened->substr(8, kShareBytes);
    h.b_share = opened->substr(8 + kShareBytes, kShareBytes);
    h.ok = true;
  }
  // Reused across rounds: a fresh vector of a million integers costs its page faults again.
  constexpr size_t kKeptMaskInts = size_t{1} << 22;  // 16 MiB
  thread_local std::vector<uint32_t> y;
  y.assign(input.begin(), input.end());
  for (auto& v : y) {
    if (v & ~mask) {
      return invalid_argument("secagg: an input integer " + std::to_string(v) + " >= 2^" +
                              std::to_string(params_.modulus_bits));
    }
  }
  std::vector<MaskSeed> masks;
  masks.push_back({seed_, +1});
  for (const auto& [i, h] : held) {
    ASSIGN_OR_RETURN(const Key32 pub, key_from(peers_.at(i).s_public(), "s_public"));
    ASSIGN_OR_RETURN(const Key32 pair, agree(s_.secret, pub),
                     "secagg: the pairwise mask with client " + std::to_string(i));
    masks.push_back({pair, index_ < i ? +1 : -1});
  }
  RETURN_IF_ERROR(apply_masks(masks, session_, y, params_.modulus_bits));
  held_ = std::move(held);
  v1::SecAggMaskedInput out;
  out.set_round(round_);
  out.set_session(session_);
  out.set_index(index_);
  out.set_length(y.size());
  out.set_packed(pack_bits(y, params_.modulus_bits));
  // Kept for the next round only while small: a device masking a large model gets the memory
  // back between rounds.
  if (y.capacity() > kKeptMaskInts) std::vector<uint32_t>().swap(y);
  stage_ = Stage::kMasked;
  return out;
}

Result<v1::SecAggUnmaskShares> ClientSession::unmask(const v1::SecAggUnmaskRequest& request) {
  if (stage_ == Stage::kDone) {
    return permission_denied("secagg: a second unmask request in round " + std::to_string(round_) +
                             ": refused");
  }
  if (stage_ != Stage::kMasked) {
    return failed_precondition("secagg: an unmask request before this client masked: refused");
  }
  RETURN_IF_ERROR(check_round(request.round(), request.session(), "unmask request"));
  stage_ = Stage::kDone;  // one answer per round, whatever this one is
  std::set<uint32_t> survivors, dropped;
  for (uint32_t i : request.survivors()) {
    if (!survivors.insert(i).second) {
      return permission_denied("secagg: the unmask request lists client " + std::to_string(i) +
                               " twice: refused");
    }
  }
  for (uint32_t i : request.dropped()) {
    if (survivors.count(i) || !dropped.insert(i).second) {
      return permission_denied("secagg: the unmask request lists client " + std::to_string(i) +
                               " as dropped and as surviving (or twice): refused, the server "
                               "could unmask it");
    }
  }
  if (!survivors.count(index_)) {
    return permission_denied("secagg: the unmask request does not list this client (" +
                             std::to_string(index_) + ") as a survivor: refused");
  }
  if (survivors.size() < params_.threshold) {
    return permission_denied("secagg: the unmask request names " +
                             std::to_string(survivors.size()) + " survivors, fewer than the " +
                             std::to_string(params_.threshold) + " of the threshold: refused");
  }
  v1::SecAggUnmaskShares out;
  out.set_round(round_);
  out.set_session(session_);
  out.set_index(index_);
  auto* own = out.add_shares();
  own->set_owner(index_);
  own->set_self_mask(true);
  own->set_share(own_b_share_);
  for (const auto& [i, h] : held_) {
    const bool s = survivors.count(i) > 0, d = dropped.count(i) > 0;
    if (!s && !d) {
      return permission_denied("secagg: the unmask request says nothing of neighbour " +
                               std::to_string(i) + ", which shared keys: refused");
    }
    if (!h.ok) continue;
    auto* r = out.add_shares();
    r->set_owner(i);
    r->set_self_mask(s);
    r->set_share(s ? h.b_share : h.s_share);
  }
  // Neighbours the request names that never shared with us: the server's view and ours differ.
  for (uint32_t i : graph_->neighbours(index_)) {
    if ((survivors.count(i) || dropped.count(i)) && !held_.count(i)) {
      return permission_denied("secagg: the unmask request names neighbour " + std::to_string(i) +
                               ", which never sent this client its shares: refused");
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Server

Result<std::unique_ptr<ServerSession>> ServerSession::create(uint64_t round, Params params,
                                                             std::vector<std::string> names,
                                                             std::string session) {
  RETURN_IF_ERROR(params.validate());
  if (names.size() != params.num_clients) {
    return invalid_argument("secagg: " + std::to_string(names.size()) + " names for " +
                            std::to_string(params.num_clients) + " clients");
  }
  std::unique_ptr<ServerSession> s(new ServerSession);
  if (session.empty()) {
    session.resize(kSessionBytes);
    RETURN_IF_ERROR(random_bytes(
        std::span<uint8_t>(reinterpret_cast<uint8_t*>(session.data()), session.size())));
  }
  if (session.size() != kSessionBytes) return invalid_argument("secagg: session id of 16 bytes");
  s->round_ = round;
  s->session_ = std::move(session);
  s->params_ = params;
  s->names_ = std::move(names);
  s->graph_ =
      std::make_unique<CommunicationGraph>(params.num_clients, params.degree, params.graph_seed);
  return s;
}

v1::SecAggSetup ServerSession::setup(uint32_t index) const {
  v1::SecAggSetup m;
  m.set_round(round_);
  m.set_session(session_);
  m.set_index(index);
  *m.mutable_params() = params_.to_proto();
  return m;
}

Status ServerSession::check(uint64_t round, const std::string& session, uint32_t index,
                            const char* what, int stage) const {
  if (index >= params_.num_clients) {
    return invalid_argument(std::string("secagg ") + what + " from index " + std::to_string(index) +
                            " of " + std::to_string(params_.num_clients) + " clients: refused");
  }
  const std::string who = names_[index] + ": secagg " + what;
  if (round != round_ || session != session_) {
    return permission_denied(who + " of round " + std::to_string(round) + " session " +
                             hex_prefix(session) + "... in round " + std::to_string(round_) +
                             " session " + hex_prefix(session_) +
                             "...: refused (replayed from an earlier round?)");
  }
  if (stage != stage_) {
    static const char* names[] = {"advertise", "share-keys", "masked-input", "unmask", "done"};
    return failed_precondition(who + " in the " + names[stage_] + " stage: refused");
  }
  return ok_status();
}

Status ServerSession::receive_advertise(const v1::SecAggAdvertise& m) {
  RETURN_IF_ERROR(check(m.round(), m.session(), m.index(), "keys", 0));
  const std::string& who = names_[m.index()];
  if (keys_.count(m.index())) return invalid_argument(who + ": secagg keys sent twice: refused");
  if (m.c_public().size() != 32 || m.s_public().size() != 32 || m.seed_commitment().size() != 32 ||
      m.c_public() == m.s_public()) {
    return invalid_argument(who +
                            ": malformed secagg keys (32-byte c and s keys, distinct, "
                            "and a 32-byte seed commitment expected): refused");
  }
  v1::SecAggPeerKeys k;
  k.set_index(m.index());
  k.set_c_public(m.c_public());
  k.set_s_public(m.s_public());
  k.set_seed_commitment(m.seed_commitment());
  keys_.emplace(m.index(), std::move(k));
  return ok_status();
}

Status ServerSession::close_advertise() {
  if (stage_ != 0) return failed_precondition("secagg: the advertise stage is already closed");
  stage_ = 1;
  if (keys_.size() < params_.threshold) {
    stage_ = 4;
    return failed_precondition(
        "secagg round " + std::to_string(round_) + ": only " + std::to_string(keys_.size()) +
        " of " + std::to_string(params_.num_clients) + " clients advertised keys; threshold " +
        std::to_string(params_.threshold) + " cannot hold: round aborted");
  }
  return ok_status();
}

v1::SecAggKeys ServerSession::keys_for(uint32_t index) const {
  v1::SecAggKeys m;
  m.set_round(round_);
  m.set_session(session_);
  for (uint32_t j : graph_->neighbours(index)) {
    auto it = keys_.find(j);
    if (it != keys_.end()) *m.add_peers() = it->second;
  }
  return m;
}

Status ServerSession::receive_share_keys(const v1::SecAggShareKeys& m) {
  RETURN_IF_ERROR(check(m.round(), m.session(), m.index(), "shares", 1));
  const uint32_t i = m.index();
  const std::string& who = names_[i];
  if (!keys_.count(i)) {
    return permission_denied(who +
                             ": secagg shares from a client that advertised no keys: refused");
  }
  if (shared_.count(i)) return invalid_argument(who + ": secagg shares sent twice: refused");
  std::set<uint32_t> expected;
  for (uint32_t j : graph_->neighbours(i)) {
    if (keys_.count(j)) expected.insert(j);
  }
  if (static_cast<size_t>(m.ciphertexts_size()) != expected.size()) {
    return invalid_argument(who + ": " + std::to_string(m.ciphertexts_size()) +
                            " secagg share ciphertexts, " + std::to_string(expected.size()) +
                            " expected (one per neighbour with keys): refused");
  }
  std::set<uint32_t> seen;
  for (const auto& ct : m.ciphertexts()) {
    if (ct.from() != i || !expected.count(ct.to()) || !seen.insert(ct.to()).second) {
      return invalid_argument(who + ": a secagg share ciphertext from " +
                              std::to_string(ct.from()) + " to " + std::to_string(ct.to()) +
                              " (not one per neighbour): refused");
    }
    if (ct.ciphertext().size() != kSealedBytes) {
      return invalid_argument(who + ": a secagg share ciphertext of " +
                              std::to_string(ct.ciphertext().size()) + " bytes (" +
                              std::to_string(kSealedBytes) + " expected): refused");
    }
  }
  for (const auto& ct : m.ciphertexts()) inbox_[ct.to()].push_back(ct);
  shared_.insert(i);
  return ok_status();
}

Status ServerSession::close_share_keys() {
  if (stage_ != 1) return failed_precondition("secagg: not in the share-keys stage");
  stage_ = 2;
  if (shared_.size() < params_.threshold) {
    stage_ = 4;
    return failed_precondition("secagg round " + std::to_string(round_) + ": only " +
                               std::to_string(shared_.size()) +
                               " clients shared their keys; threshold " +
                               std::to_string(params_.threshold) + " cannot hold: round aborted");
  }
  sum_.assign(params_.vector_length, 0);
  scratch_.assign(params_.vector_length, 0);
  return ok_status();
}

v1::SecAggCiphertexts ServerSession::ciphertexts_for(uint32_t index) const {
  v1::SecAggCiphertexts m;
  m.set_round(round_);
  m.set_session(session_);
  auto it = inbox_.find(index);
  if (it == inbox_.end()) return m;
  for (const auto& ct : it->second) {
    if (shared_.count(ct.from())) *m.add_ciphertexts() = ct;
  }
  return m;
}

Status ServerSession::receive_masked_input(const v1::SecAggMaskedInput& m) {
  RETURN_IF_ERROR(check(m.round(), m.session(), m.index(), "masked vector", 2));
  const std::string& who = names_[m.index()];
  if (!shared_.count(m.index())) {
    return permission_denied(who +
                             ": a masked vector from a client that did not share its "
                             "keys: refused");
  }
  if (survivors_.count(m.index()))
    return invalid_argument(who + ": a second masked vector: refused");
  if (m.length() != params_.vector_length) {
    return invalid_argument(who + ": a masked vector of " + std::to_string(m.length()) +
                            " integers, " + std::to_string(params_.vector_length) +
                            " expected: refused");
  }
  RETURN_IF_ERROR(unpack_bits(m.packed(), params_.modulus_bits, scratch_),
                  who + ": masked vector refused");
  const uint32_t mask = modulus_mask(params_.modulus_bits);
  for (size_t k = 0; k < sum_.size(); ++k) sum_[k] = (sum_[k] + scratch_[k]) & mask;
  survivors_.insert(m.index());
  return ok_status();
}

Result<v1::SecAggUnmaskRequest> ServerSession::close_masked_input() {
  if (stage_ != 2) return failed_precondition("secagg: not in the masked-input stage");
  stage_ = 3;
  std::fill(scratch_.begin(), scratch_.end(), 0u);
  if (survivors_.size() < params_.threshold) {
    stage_ = 4;
    sum_.assign(sum_.size(), 0u);
    return failed_precondition(
        "secagg round " + std::to_string(round_) + ": only " + std::to_string(survivors_.size()) +
        " of " + std::to_string(shared_.size()) + " clients sent a masked vector; threshold " +
        std::to_string(params_.threshold) + " cannot hold: round aborted, nothing unmasked");
  }
  for (uint32_t i : shared_) {
    if (!survivors_.count(i)) dropped_.insert(i);
  }
  v1::SecAggUnmaskRequest r;
  r.set_round(round_);
  r.set_session(session_);
  for (uint32_t i : survivors_) r.add_survivors(i);
  for (uint32_t i : dropped_) r.add_dropped(i);
  return r;
}

Status ServerSession::receive_unmask_shares(const v1::SecAggUnmaskShares& m) {
  RETURN_IF_ERROR(check(m.round(), m.session(), m.index(), "unmask shares", 3));
  const uint32_t r = m.index();
  const std::string& who = names_[r];
  if (!survivors_.count(r)) {
    return permission_denied(who +
                             ": unmask shares from a client that is not a survivor: "
                             "refused");
  }
  if (responders_.count(r)) return invalid_argument(who + ": unmask shares sent twice: refused");
  std::set<uint32_t> owners;
  for (const auto& s : m.shares()) {
    const uint32_t o = s.owner();
    if (o >= params_.num_clients || (o != r && !graph_->adjacent(o, r)) || !shared_.count(o) ||
        !owners.insert(o).second) {
      return invalid_argument(who + ": an unmask share of client " + std::to_string(o) +
                              ", which it does not hold (or twice): refused");
    }
    if (s.self_mask() != (survivors_.count(o) > 0)) {
      return invalid_argument(who + ": a share of the wrong secret of client " + std::to_string(o) +
                              ": refused");
    }
    if (s.share().size() != kShareBytes) {
      return invalid_argument(who + ": an unmask share of " + std::to_string(s.share().size()) +
                              " bytes (" + std::to_string(kShareBytes) + " expected): refused");
    }
  }
  for (const auto& s : m.shares()) {
    auto& list = s.self_mask() ? b_shares_[s.owner()] : s_shares_[s.owner()];
    list.emplace_back(r + 1, s.share());
  }
  responders_.insert(r);
  return ok_status();
}

Result<Key32> ServerSession::reconstruct(uint32_t owner, bool self_mask) {
  auto& list = self_mask ? b_shares_[owner] : s_shares_[owner];
  const char* what = self_mask ? "self-mask seed" : "mask key";
  const uint32_t t = params_.threshold;
  if (list.size() < t) {
    return failed_precondition("secagg round " + std::to_string(round_) + ": " +
                               std::to_string(list.size()) + " shares of the " + what + " of " +
                               names_[owner] + ", threshold " + std::to_string(t) +
                               ": round aborted");
  }
  const auto& keys = keys_.at(owner);
  auto verify = [&](const Key32& secret) -> bool {
    if (self_mask) return as_view(sha256(as_view(secret))) == keys.seed_commitment();
    auto pub = public_key_of(secret);
    return pub.ok() && as_view(*pub) == keys.s_public();
  };
  // The first t shares, then other subsets: a wrong share (a faulty or lying holder) is passed
  // over as long as t consistent ones exist among the first tries.
  std::vector<std::pair<uint32_t, std::string>> pick(list.begin(), list.begin() + t);
  Rng rng(owner);
  for (int attempt = 0; attempt < 64; ++attempt) {
    auto secret = shamir_combine(pick, t);
    if (secret.ok() && verify(*secret)) return *secret;
    if (list.size() == t) break;
    std::vector<std::pair<uint32_t, std::string>> shuffled = list;
    for (size_t i = shuffled.size(); i > 1; --i) std::swap(shuffled[i - 1], shuffled[rng.below(i)]);
    pick.assign(shuffled.begin(), shuffled.begin() + t);
  }
  return failed_precondition("secagg round " + std::to_string(round_) + ": the " +
                             std::to_string(list.size()) + " shares of the " + what + " of " +
                             names_[owner] +
                             " do not reconstruct the committed secret: round "
                             "aborted");
}

Result<std::vector<uint32_t>> ServerSession::finish() {
  if (stage_ != 3) return failed_precondition("secagg: finish() outside the unmask stage");
  stage_ = 4;
  const uint32_t bits = params_.modulus_bits;
  std::vector<MaskSeed> masks;
  for (uint32_t j : survivors_) {
    ASSIGN_OR_RETURN(const Key32 b, reconstruct(j, true));
    masks.push_back({b, -1});
  }
  for (uint32_t i : dropped_) {
    ASSIGN_OR_RETURN(const Key32 s, reconstruct(i, false));
    for (uint32_t j : graph_->neighbours(i)) {
      if (!survivors_.count(j)) continue;
      ASSIGN_OR_RETURN(const Key32 pub, key_from(keys_.at(j).s_public(), "s_public"));
      ASSIGN_OR_RETURN(const Key32 pair, agree(s, pub),
                       "secagg: the mask between " + names_[i] + " and " + names_[j]);
      // j added (j < i ? + : -) PRG(pair); take it away.
      masks.push_back({pair, j < i ? -1 : +1});
    }
  }
  RETURN_IF_ERROR(apply_masks(masks, session_, sum_, bits));
  return sum_;
}

std::vector<uint32_t> ServerSession::advertised() const {
  std::vector<uint32_t> v;
  for (const auto& [i, k] : keys_) v.push_back(i);
  return v;
}
std::vector<uint32_t> ServerSession::shared() const { return {shared_.begin(), shared_.end()}; }
std::vector<uint32_t> ServerSession::survivors() const {
  return {survivors_.begin(), survivors_.end()};
}
std::vector<uint32_t> ServerSession::responders() const {
  return {responders_.begin(), responders_.end()};
}

}  // namespace starling::secagg
