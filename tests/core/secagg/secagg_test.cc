// SecAgg+: the primitives (Shamir, the graph, the crypto, packing, quantization) and whole
// rounds of the protocol with dropouts, a malicious server and malformed or replayed messages.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "core/secagg/crypto.h"
#include "core/secagg/protocol.h"
#include "core/secagg/quantize.h"
#include "core/secagg/shamir.h"
#include "core/util/rng.h"

namespace starling::secagg {
namespace {

Key32 key_of(uint8_t fill) {
  Key32 k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(fill + 7 * i);
  return k;
}

// One round of n clients driven stage by stage. Clients listed in `drop_after_share` do not
// send a masked vector; the result is compared with the plaintext sum of the others' inputs.
struct Round {
  Params params;
  std::unique_ptr<ServerSession> server;
  std::vector<std::unique_ptr<ClientSession>> clients;
  std::vector<std::vector<uint32_t>> inputs;

  static Round make(uint32_t n, uint32_t dim, uint32_t bits, uint32_t threshold = 0,
                    uint32_t degree = 0, uint64_t round = 7) {
    Round r;
    auto p = plan_round(n, threshold, degree, bits, dim);
    REQUIRE(p.ok());
    r.params = *p;
    std::vector<std::string> names;
    for (uint32_t i = 0; i < n; ++i) names.push_back("client-" + std::to_string(i));
    auto s = ServerSession::create(round, r.params, names);
    REQUIRE(s.ok());
    r.server = std::move(*s);
    Rng rng(n * 1000 + dim);
    for (uint32_t i = 0; i < n; ++i) {
      auto c = ClientSession::create(round, r.server->setup(i));
      REQUIRE(c.ok());
      r.clients.push_back(std::move(*c));
      std::vector<uint32_t> x(dim);
      for (auto& v : x) v = static_cast<uint32_t>(rng.next_u64()) & modulus_mask(bits);
      r.inputs.push_back(std::move(x));
    }
    return r;
  }

  void advertise_and_share(const std::set<uint32_t>& silent = {}) {
    for (auto& c : clients) {
      if (silent.count(c->index())) continue;
      REQUIRE(server->receive_advertise(c->advertise()).ok());
    }
    REQUIRE(server->close_advertise().ok());
    for (auto& c : clients) {
      if (silent.count(c->index())) continue;
      auto sk = c->share_keys(server->keys_for(c->index()));
      REQUIRE(sk.ok());
      REQUIRE(server->receive_share_keys(*sk).ok());
    }
    REQUIRE(server->close_share_keys().ok());
  }

  // Returns the masked messages (kept so tests can look at them).
  std::map<uint32_t, v1::SecAggMaskedInput> mask(const std::set<uint32_t>& dropped) {
    std::map<uint32_t, v1::SecAggMaskedInput> sent;
    for (uint32_t i : server->shared()) {
      auto m = clients[i]->masked_input(server->ciphertexts_for(i), inputs[i]);
      REQUIRE(m.ok());
      if (dropped.count(i)) continue;
      REQUIRE(server->receive_masked_input(*m).ok());
      sent.emplace(i, *m);
    }
    return sent;
  }

  Result<std::vector<uint32_t>> unmask(const std::set<uint32_t>& silent_in_unmask = {}) {
    ASSIGN_OR_RETURN(auto request, server->close_masked_input());
    for (uint32_t i : server->survivors()) {
      if (silent_in_unmask.count(i)) continue;
      auto shares = clients[i]->unmask(request);
      REQUIRE(shares.ok());
      REQUIRE(server->receive_unmask_shares(*shares).ok());
    }
    return server->finish();
  }

  std::vector<uint32_t> plain_sum(const std::vector<uint32_t>& who) const {
    std::vector<uint32_t> s(params.vector_length, 0);
    for (uint32_t i : who) {
      for (size_t k = 0; k < s.size(); ++k) {
        s[k] = (s[k] + inputs[i][k]) & modulus_mask(params.modulus_bits);
      }
    }
    return s;
  }
};

std::set<uint32_t> first_k(uint32_t n, uint32_t k, uint64_t seed) {
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  Rng rng(seed);
  for (uint32_t i = n; i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  return {all.begin(), all.begin() + k};
}

// 0..n-1 without `gone`, ascending.
std::vector<uint32_t> all_but(uint32_t n, const std::set<uint32_t>& gone) {
  std::vector<uint32_t> v;
  for (uint32_t i = 0; i < n; ++i) {
    if (!gone.count(i)) v.push_back(i);
  }
  return v;
}

// Pearson's chi-square statistic of `v`'s residues mod `bins` against the uniform law.
double chi_square(const std::vector<uint32_t>& v, uint32_t bins) {
  std::vector<double> count(bins, 0);
  for (uint32_t x : v) count[x % bins] += 1;
  const double expect = static_cast<double>(v.size()) / bins;
  double chi = 0;
  for (double c : count) chi += (c - expect) * (c - expect) / expect;
  return chi;
}

}  // namespace

TEST_CASE("shamir: any t of n shares give the secret back, t - 1 or a wrong share do not") {
  const Key32 secret = key_of(3);
  const std::vector<uint32_t> xs = {1, 2, 3, 4, 5, 6, 7};
  auto shares = shamir_split(secret, 4, xs);
  REQUIRE(shares.ok());
  REQUIRE(shares->size() == 7);
  for (uint32_t start = 0; start + 4 <= 7; ++start) {
    std::vector<std::pair<uint32_t, std::string>> pick;
    for (uint32_t k = start; k < start + 4; ++k) pick.emplace_back(xs[k], (*shares)[k]);
    auto got = shamir_combine(pick, 4);
    REQUIRE(got.ok());
    CHECK(*got == secret);
  }
  std::vector<std::pair<uint32_t, std::string>> three = {
      {1, (*shares)[0]}, {2, (*shares)[1]}, {3, (*shares)[2]}};
  CHECK(shamir_combine(three, 4).status().code() == StatusCode::kInvalidArgument);
  // Three shares interpolated as if they were a threshold-3 sharing: not the secret.
  auto wrong_t = shamir_combine(three, 3);
  CHECK((!wrong_t.ok() || *wrong_t != secret));
  std::vector<std::pair<uint32_t, std::string>> tampered = {
      {1, (*shares)[0]}, {2, (*shares)[1]}, {3, (*shares)[2]}, {4, (*shares)[3]}};
  tampered[2].second[5] ^= 1;
  auto bad = shamir_combine(tampered, 4);
  CHECK((!bad.ok() || *bad != secret));
  tampered[2].second.resize(39);
  CHECK(shamir_combine(tampered, 4).status().code() == StatusCode::kInvalidArgument);
  std::vector<std::pair<uint32_t, std::string>> repeated = {
      {1, (*shares)[0]}, {1, (*shares)[0]}, {3, (*shares)[2]}, {4, (*shares)[3]}};
  CHECK(shamir_combine(repeated, 4).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("secagg graph: a Harary graph of the asked degree, the same from the same seed") {
  const Key32 seed = key_of(9);
  CommunicationGraph g(50, 12, seed), again(50, 12, seed), other(50, 12, key_of(10));
  bool differs = false;
  for (uint32_t a = 0; a < 50; ++a) {
    CHECK(g.neighbours(a).size() == 12);
    CHECK(g.neighbours(a) == again.neighbours(a));
    differs = differs || g.neighbours(a) != other.neighbours(a);
    for (uint32_t b : g.neighbours(a)) {
      CHECK(g.adjacent(a, b));
      CHECK(g.adjacent(b, a));
    }
    CHECK_FALSE(g.adjacent(a, a));
  }
  CHECK(differs);
  CommunicationGraph complete(6, 5, seed);
  for (uint32_t a = 0; a < 6; ++a) CHECK(complete.neighbours(a).size() == 5);
}

TEST_CASE(
    "secagg crypto: agreement is symmetric, sealed shares open only unchanged, masks cancel") {
  auto a = generate_keypair(), b = generate_keypair();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto ab = agree(a->secret, b->public_key), ba = agree(b->secret, a->public_key);
  REQUIRE(ab.ok());
  REQUIRE(ba.ok());
  CHECK(*ab == *ba);
  CHECK(*public_key_of(a->secret) == a->public_key);
  CHECK_FALSE(agree(a->secret, Key32{}).ok());  // the zero point: small order

  auto key = derive(*ab, "session", "info");
  REQUIRE(key.ok());
  auto sealed = seal(*key, "aad", "eighty-eight bytes of shares");
  REQUIRE(sealed.ok());
  CHECK(*open(*key, "aad", *sealed) == "eighty-eight bytes of shares");
  CHECK(open(*key, "other aad", *sealed).status().code() == StatusCode::kDataLoss);
  std::string flipped = *sealed;
  flipped[14] ^= 1;
  CHECK(open(*key, "aad", flipped).status().code() == StatusCode::kDataLoss);
  CHECK(open(*key, "aad", sealed->substr(0, 20)).status().code() == StatusCode::kDataLoss);

  for (uint32_t bits : {32u, 20u, 7u}) {
    std::vector<uint32_t> v(10000);
    Rng rng(bits);
    for (auto& x : v) x = static_cast<uint32_t>(rng.next_u64()) & modulus_mask(bits);
    const auto original = v;
    REQUIRE(apply_mask(*ab, "s1", v, +1, bits).ok());
    CHECK(v != original);
    for (uint32_t x : v) REQUIRE(x <= modulus_mask(bits));
    REQUIRE(apply_mask(*ab, "s1", v, -1, bits).ok());
    CHECK(v == original);
  }
}

TEST_CASE("secagg packing: integers of 1 to 32 bits round-trip, a wrong size is refused") {
  for (uint32_t bits = 1; bits <= 32; ++bits) {
    std::vector<uint32_t> v(1001);
    Rng rng(bits);
    for (auto& x : v) x = static_cast<uint32_t>(rng.next_u64()) & modulus_mask(bits);
    const std::string packed = pack_bits(v, bits);
    REQUIRE(packed.size() == packed_size(v.size(), bits));
    std::vector<uint32_t> back(v.size());
    REQUIRE(unpack_bits(packed, bits, back).ok());
    CHECK(back == v);
    std::vector<uint32_t> longer(v.size() + 8);
    CHECK(unpack_bits(packed, bits, longer).code() == StatusCode::kDataLoss);
  }
}

TEST_CASE("secagg quantizer: unbiased stochastic rounding, clipping, error feedback, sums back") {
  Quantizer q{.clip_range = 0.5, .levels = 255, .bits = 16};
  REQUIRE(q.validate(10).ok());
  // 255 levels over [-0.5, 0.5]: a step of 1/254. The mean of many roundings is the value.
  const std::vector<float> x = {0.3f, -0.2071f, 0.00123f, -0.49f, 0.9f, -3.0f};
  const std::vector<double> want = {0.3, -0.2071, 0.00123, -0.49, 0.5, -0.5};
  std::vector<double> mean(x.size(), 0.0);
  Rng rng(5);
  std::vector<uint32_t> out(x.size());
  std::vector<float> one(x.size());
  const int reps = 20000;
  for (int r = 0; r < reps; ++r) {
    q.quantize(x, {}, rng, out);
    q.dequantize_sum(out, one);
    for (size_t i = 0; i < x.size(); ++i) mean[i] += one[i] / reps;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    // Standard error of the mean of a rounding within one step: < 0.5 step / sqrt(reps).
    CHECK(std::abs(mean[i] - want[i]) < 4 * (1.0 / 254) / std::sqrt(reps) + 1e-6);
  }
  // Error feedback: what was not sent comes back next time, so the running total tracks x.
  std::vector<float> residual(x.size(), 0.0f);
  std::vector<double> sent(x.size(), 0.0);
  for (int r = 0; r < 50; ++r) {
    q.quantize(x, residual, rng, out);
    q.dequantize_sum(out, one);
    for (size_t i = 0; i < x.size(); ++i) sent[i] += one[i];
  }
  for (size_t i = 0; i < 4; ++i) CHECK(std::abs(sent[i] - 50 * x[i]) < 1.0 / 254 + 1e-4);
  // Sums of negative and positive integers mod 2^16 come back as floats.
  std::vector<uint32_t> sum(2, 0);
  for (int c = 0; c < 10; ++c) {
    q.quantize(std::vector<float>{-0.5f, 0.5f}, {}, rng, std::span<uint32_t>(out.data(), 2));
    sum[0] = (sum[0] + out[0]) & 0xFFFF;
    sum[1] = (sum[1] + out[1]) & 0xFFFF;
  }
  std::vector<float> total(2);
  q.dequantize_sum(sum, total);
  CHECK(total[0] == Approx(-5.0));
  CHECK(total[1] == Approx(5.0));
  // 300 clients of up to 127 overflow 16 bits: a clear error naming the keys.
  const Status over = q.validate(300);
  CHECK(over.code() == StatusCode::kInvalidArgument);
  CHECK(over.message().find("secagg.modulus_bits") != std::string::npos);
  CHECK_FALSE((Quantizer{.clip_range = 0, .levels = 255, .bits = 16}.validate(1).ok()));
}

TEST_CASE("secagg parameters: thresholds that cannot hold are refused with the key named") {
  auto p = plan_round(100, 0, 0, 32, 10);
  REQUIRE(p.ok());
  CHECK(p->degree == 14);  // 2 ceil(log2 100)
  CHECK(p->threshold == 8);
  // Planned for 10% dropping: wider, so that a neighbourhood keeps its majority.
  auto wide = plan_round(1000, 0, 0, 32, 10, 0.1);
  REQUIRE(wide.ok());
  CHECK(wide->degree > 20);
  CHECK(wide->degree < 60);
  CHECK(reconstruction_failure_bound(1000, wide->degree, wide->threshold, 0.1) <= 1e-6);
  CHECK(reconstruction_failure_bound(1000, 20, 11, 0.1) > 1e-3);
  CHECK_FALSE(plan_round(10, 0, 0, 32, 10, 0.5).ok());
  auto small = plan_round(5, 0, 0, 32, 10);
  REQUIRE(small.ok());
  CHECK(small->degree == 4);  // the complete graph
  auto too_high = plan_round(100, 16, 14, 32, 10);
  REQUIRE_FALSE(too_high.ok());
  CHECK(too_high.status().message().find("secagg.threshold 16 exceeds") != std::string::npos);
  auto too_low = plan_round(100, 7, 14, 32, 10);
  REQUIRE_FALSE(too_low.ok());
  CHECK(too_low.status().message().find("more than half") != std::string::npos);
  auto odd = plan_round(100, 0, 13, 32, 10);
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.status().message().find("secagg.degree 13") != std::string::npos);
  CHECK_FALSE(plan_round(1, 0, 0, 32, 10).ok());
  CHECK_FALSE(plan_round(10, 0, 0, 33, 10).ok());
}

TEST_CASE("secagg: the unmasked sum is the survivors' sum exactly, with 0, 10% and 30% dropping") {
  for (uint32_t bits : {32u, 13u}) {
    for (double fraction : {0.0, 0.1, 0.3}) {
      // The degree planned for the dropout rate (every other client at 30%).
      const uint32_t n = 40;
      auto planned = plan_round(n, 0, 0, bits, 257, fraction);
      REQUIRE(planned.ok());
      INFO("bits " << bits << " dropping " << fraction << " degree " << planned->degree);
      if (planned->degree < n - 1) {
        CHECK(reconstruction_failure_bound(n, planned->degree, planned->threshold, fraction) <=
              1e-6);
      }
      Round r = Round::make(n, 257, bits, 0, planned->degree);
      r.advertise_and_share();
      const auto dropped = first_k(n, static_cast<uint32_t>(fraction * n), bits);
      r.mask(dropped);
      auto sum = r.unmask();
      REQUIRE(sum.ok());
      const std::vector<uint32_t> alive = all_but(n, dropped);
      CHECK(r.server->survivors() == alive);
      CHECK(*sum == r.plain_sum(alive));
    }
  }
  // The sparse graph of a larger round: 300 clients, degree planned for 10% dropping.
  auto planned = plan_round(300, 0, 0, 32, 64, 0.1);
  REQUIRE(planned.ok());
  CHECK(planned->degree < 60);
  Round r = Round::make(300, 64, 32, 0, planned->degree);
  r.advertise_and_share();
  const auto dropped = first_k(300, 30, 11);
  r.mask(dropped);
  auto sum = r.unmask();
  REQUIRE(sum.ok());
  const std::vector<uint32_t> alive = all_but(300, dropped);
  CHECK(*sum == r.plain_sum(alive));
}

TEST_CASE("secagg: clients silent before sharing, and survivors silent in the unmask stage") {
  const uint32_t n = 20;
  Round r = Round::make(n, 64, 32, 0, 0);  // degree 10, threshold 6
  r.advertise_and_share({3, 11});          // never advertised or shared
  CHECK(r.server->shared().size() == 18);
  r.mask({5});
  auto sum = r.unmask({0, 1});  // survivors 0 and 1 answer nothing in the unmask stage
  REQUIRE(sum.ok());
  CHECK(*sum == r.plain_sum(all_but(n, {3, 5, 11})));
}

TEST_CASE("secagg: too many dropouts abort the round with a clear message and unmask nothing") {
  const uint32_t n = 10;
  Round r = Round::make(n, 32, 32, 6, 9);
  r.advertise_and_share();
  r.mask({0, 1, 2, 3, 4});  // 5 survivors, threshold 6
  auto request = r.server->close_masked_input();
  REQUIRE_FALSE(request.ok());
  CHECK(request.status().message().find("only 5 of 10 clients sent a masked vector; threshold 6 "
                                        "cannot hold") != std::string::npos);
  for (uint32_t x : r.server->running_sum()) CHECK(x == 0u);  // the masked sum is forgotten

  // Enough survivors, but too few of them answer the unmask stage.
  Round s = Round::make(n, 32, 32, 6, 9);
  s.advertise_and_share();
  s.mask({0});
  auto sum = s.unmask({1, 2, 3, 4});  // 5 of 9 survivors answer
  REQUIRE_FALSE(sum.ok());
  CHECK(sum.status().message().find("threshold 6: round aborted") != std::string::npos);
}

TEST_CASE("secagg: a masked vector alone is indistinguishable from uniform (chi-square)") {
  // Inputs chosen to be as far from uniform as can be: all zero.
  const uint32_t n = 8, dim = 40000;
  Round r = Round::make(n, dim, 32, 0, 0);
  for (auto& x : r.inputs) std::fill(x.begin(), x.end(), 0u);
  r.advertise_and_share();
  const auto sent = r.mask({});
  // 256 bins, 255 degrees of freedom. The keys are fresh random ones every run, and the test
  // makes 16 such checks, so at the 0.999 quantile (330.5) it failed about one run in 60 on
  // uniform data; at the 1 - 1e-6 quantile (377.1) one in 60,000. Masks that failed would still
  // be caught: unmasked zeros put every value in one bin (chi-square about 10 million).
  const double critical = 377.1;
  for (const auto& [i, m] : sent) {
    std::vector<uint32_t> y(dim);
    REQUIRE(unpack_bits(m.packed(), 32, y).ok());
    CHECK(chi_square(y, 256) < critical);
    std::vector<uint32_t> high(dim);
    for (size_t k = 0; k < dim; ++k) high[k] = y[k] >> 24;
    CHECK(chi_square(high, 256) < critical);
  }
  // The server's running sum after the first masked vector is that vector: uniform too, and
  // the session never holds more than that one vector.
  CHECK(r.server->vectors_held() == 1);
  CHECK(chi_square(
            std::vector<uint32_t>(r.server->running_sum().begin(), r.server->running_sum().end()),
            256) < critical);
  // The test can fail: an unmasked quantized update (small integers) is far from uniform.
  Quantizer q{.clip_range = 1.0, .levels = 1u << 16, .bits = 32};
  std::vector<float> update(dim);
  Rng rng(1);
  for (auto& v : update) v = static_cast<float>(0.01 * rng.normal());
  std::vector<uint32_t> quantized(dim);
  q.quantize(update, {}, rng, quantized);
  for (auto& v : quantized) v >>= 24;  // the high byte, as checked above: 0 or 255
  CHECK(chi_square(quantized, 256) > critical);
  auto sum = r.unmask();
  REQUIRE(sum.ok());
  for (uint32_t x : *sum) REQUIRE(x == 0u);
}

TEST_CASE("secagg: honest clients refuse an unmask request that would reveal a survivor") {
  const uint32_t n = 10;
  Round r = Round::make(n, 16, 32, 6, 9);  // complete graph: 10 holders of each secret
  r.advertise_and_share();
  r.mask({});
  auto honest = r.server->close_masked_input();
  REQUIRE(honest.ok());
  // A request that names client 4 both survivor and dropped.
  v1::SecAggUnmaskRequest both = *honest;
  both.add_dropped(4);
  auto refused = r.clients[0]->unmask(both);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  // Each client answers once: client 0 is done, even with the honest request now.
  CHECK(r.clients[0]->unmask(*honest).status().code() == StatusCode::kPermissionDenied);
  // A request that leaves the client itself out, or lists it as dropped.
  v1::SecAggUnmaskRequest without_me = *honest;
  without_me.clear_survivors();
  for (uint32_t i = 0; i < n; ++i) {
    if (i != 1) without_me.add_survivors(i);
  }
  without_me.add_dropped(1);
  CHECK(r.clients[1]->unmask(without_me).status().code() == StatusCode::kPermissionDenied);
  // A request that says nothing of a neighbour that shared.
  v1::SecAggUnmaskRequest silent = *honest;
  silent.clear_survivors();
  for (uint32_t i = 0; i < n; ++i) {
    if (i != 7) silent.add_survivors(i);
  }
  CHECK(r.clients[2]->unmask(silent).status().code() == StatusCode::kPermissionDenied);

  // The split-view attack: the server tells half of client 9's holders that 9 survived (to get
  // shares of its seed b) and the other half that it dropped (to get shares of its key s).
  // Each client answers once, and the threshold is a majority of the holders, so at most one
  // side can reach it: the server cannot remove client 9's masks.
  Round m = Round::make(n, 16, 32, 6, 9);
  m.advertise_and_share();
  m.mask({});
  auto req = m.server->close_masked_input();
  REQUIRE(req.ok());
  v1::SecAggUnmaskRequest says_dropped;
  says_dropped.set_round(req->round());
  says_dropped.set_session(req->session());
  for (uint32_t i = 0; i < 9; ++i) says_dropped.add_survivors(i);
  says_dropped.add_dropped(9);
  std::vector<std::pair<uint32_t, std::string>> b9, s9;
  for (uint32_t i = 0; i < n; ++i) {
    const bool told_survived = i < 5 || i == 9;
    auto a = m.clients[i]->unmask(told_survived ? *req : says_dropped);
    REQUIRE(a.ok());
    for (const auto& s : a->shares()) {
      if (s.owner() != 9) continue;
      (s.self_mask() ? b9 : s9).emplace_back(i + 1, s.share());
    }
    // Asking again with the other view is refused.
    CHECK_FALSE(m.clients[i]->unmask(told_survived ? says_dropped : *req).ok());
  }
  CHECK(b9.size() + s9.size() == n);
  CHECK((b9.size() < m.params.threshold || s9.size() < m.params.threshold));
}

TEST_CASE(
    "secagg: malformed, replayed and misrouted messages are refused naming the client, "
    "and the round completes without them") {
  const uint32_t n = 16;
  Round r = Round::make(n, 50, 32, 9, 15);  // the complete graph, threshold 9
  // A replay: client 2's keys from another session of the same round are refused.
  Round other = Round::make(n, 50, 32, 9, 15);
  auto replay = r.server->receive_advertise(other.clients[2]->advertise());
  CHECK(replay.code() == StatusCode::kPermissionDenied);
  CHECK(replay.message().find("client-2") != std::string::npos);
  CHECK(replay.message().find("replayed") != std::string::npos);
  for (auto& c : r.clients) REQUIRE(r.server->receive_advertise(c->advertise()).ok());
  CHECK(r.server->receive_advertise(r.clients[0]->advertise()).message().find("twice") !=
        std::string::npos);
  REQUIRE(r.server->close_advertise().ok());
  // A message of the wrong stage.
  CHECK(r.server->receive_advertise(r.clients[1]->advertise()).code() ==
        StatusCode::kFailedPrecondition);
  std::set<uint32_t> refused;
  for (auto& c : r.clients) {
    auto sk = c->share_keys(r.server->keys_for(c->index()));
    REQUIRE(sk.ok());
    if (c->index() == 4) {
      sk->mutable_ciphertexts()->RemoveLast();  // a wrong share count
      const Status st = r.server->receive_share_keys(*sk);
      CHECK(st.message().find("client-4") != std::string::npos);
      CHECK(st.message().find("expected") != std::string::npos);
      refused.insert(4);
      continue;
    }
    if (c->index() == 6) {
      (*sk->mutable_ciphertexts(0)->mutable_ciphertext())[3] ^= 1;  // malformed: tampered
    }
    if (c->index() == 7) {
      sk->mutable_ciphertexts(0)->mutable_ciphertext()->resize(50);  // malformed: cut
      CHECK(r.server->receive_share_keys(*sk).message().find("client-7") != std::string::npos);
      refused.insert(7);
      continue;
    }
    REQUIRE(r.server->receive_share_keys(*sk).ok());
  }
  REQUIRE(r.server->close_share_keys().ok());
  int undecryptable = 0;
  for (uint32_t i : r.server->shared()) {
    auto m = r.clients[i]->masked_input(r.server->ciphertexts_for(i), r.inputs[i]);
    REQUIRE(m.ok());
    undecryptable += r.clients[i]->undecryptable();
    if (i == 9) {
      m->set_length(49);  // a masked vector of the wrong length
      const Status st = r.server->receive_masked_input(*m);
      CHECK(st.message().find("client-9") != std::string::npos);
      refused.insert(9);
      continue;
    }
    if (i == 10) {
      m->mutable_packed()->pop_back();
      CHECK(r.server->receive_masked_input(*m).message().find("client-10") != std::string::npos);
      refused.insert(10);
      continue;
    }
    REQUIRE(r.server->receive_masked_input(*m).ok());
  }
  CHECK(undecryptable == 1);  // client 6's tampered ciphertext, for one neighbour
  auto request = r.server->close_masked_input();
  REQUIRE(request.ok());
  for (uint32_t i : r.server->survivors()) {
    auto shares = r.clients[i]->unmask(*request);
    REQUIRE(shares.ok());
    if (i == 0) {
      auto bad = *shares;
      bad.mutable_shares(0)->mutable_share()->append("x");
      CHECK(r.server->receive_unmask_shares(bad).message().find("client-0") != std::string::npos);
      continue;  // client 0's shares are refused; the others suffice
    }
    REQUIRE(r.server->receive_unmask_shares(*shares).ok());
  }
  auto sum = r.server->finish();
  REQUIRE(sum.ok());
  const std::vector<uint32_t> alive = all_but(n, refused);
  CHECK(r.server->survivors() == alive);
  CHECK(*sum == r.plain_sum(alive));
}

TEST_CASE("secagg: a lying holder's wrong share is passed over when enough honest ones remain") {
  const uint32_t n = 10;
  Round r = Round::make(n, 20, 32, 6, 9);
  r.advertise_and_share();
  r.mask({8});
  auto request = r.server->close_masked_input();
  REQUIRE(request.ok());
  for (uint32_t i : r.server->survivors()) {
    auto shares = r.clients[i]->unmask(*request);
    REQUIRE(shares.ok());
    if (i == 0) {
      for (auto& s : *shares->mutable_shares()) (*s.mutable_share())[2] ^= 0x40;  // lies
    }
    REQUIRE(r.server->receive_unmask_shares(*shares).ok());
  }
  auto sum = r.server->finish();
  REQUIRE(sum.ok());
  std::vector<uint32_t> alive = {0, 1, 2, 3, 4, 5, 6, 7, 9};
  CHECK(*sum == r.plain_sum(alive));
}

}  // namespace starling::secagg
