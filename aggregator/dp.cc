// The RDP accountant of the subsampled Gaussian mechanism, and the DP noise.
#include "aggregator/dp.h"

#include <openssl/err.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace starling::aggregator {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)).
double log_add(double a, double b) {
  const double lo = std::min(a, b);
  const double hi = std::max(a, b);
  if (lo == -kInf) return hi;
  return std::log1p(std::exp(lo - hi)) + hi;
}

// log(erfc(x)), with the asymptotic series where erfc underflows.
double log_erfc(double x) {
  const double r = std::erfc(x);
  if (r > 0.0) return std::log(r);
  const double x2 = x * x;
  return -0.5 * std::log(M_PI) - std::log(x) - x2 - 0.5 / x2 + 0.625 / (x2 * x2) -
         37.0 / 24.0 / (x2 * x2 * x2) + 353.0 / 64.0 / (x2 * x2 * x2 * x2);
}

// Integer alpha: A = sum_i C(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2 sigma^2)).
double log_a_int(double q, double sigma, int alpha) {
  double log_a = -kInf;
  const double lq = std::log(q);
  const double l1q = std::log1p(-q);
  for (int i = 0; i <= alpha; ++i) {
    const double log_binom =
        std::lgamma(alpha + 1.0) - std::lgamma(i + 1.0) - std::lgamma(alpha - i + 1.0);
    const double s = log_binom + i * lq + (alpha - i) * l1q +
                     (static_cast<double>(i) * i - i) / (2.0 * sigma * sigma);
    log_a = log_add(log_a, s);
  }
  return log_a;
}

// Fractional alpha: the two-sided series of Mironov, Talwar, Zhang 2019 (Section 3.3). Its
// binomial coefficients C(alpha, i) change sign past alpha; like dp_accounting, every term is
// added with its absolute value, which bounds A from above (a conservative epsilon) and keeps
// the log-space sum free of cancellation. Stops once both halves' terms shrink and fall e^30
// below the total; infinity (the order is then useless) if that takes more than 1000 terms.
double log_a_frac(double q, double sigma, double alpha) {
  double log_a0 = -kInf;
  double log_a1 = -kInf;
  const double z0 = sigma * sigma * std::log(1.0 / q - 1.0) + 0.5;
  const double lq = std::log(q);
  const double l1q = std::log1p(-q);
  double last_s0 = -kInf;
  double last_s1 = -kInf;
  for (int i = 0; i < 1000; ++i) {
    // log |C(alpha, i)| = log|Gamma(alpha + 1)| - log Gamma(i + 1) - log|Gamma(alpha - i + 1)|.
    const double log_coef =
        std::lgamma(alpha + 1.0) - std::lgamma(i + 1.0) - std::lgamma(alpha - i + 1.0);
    const double j = alpha - i;
    const double log_t0 = log_coef + i * lq + j * l1q;
    const double log_t1 = log_coef + j * lq + i * l1q;
    const double log_e0 = std::log(0.5) + log_erfc((i - z0) / (std::sqrt(2.0) * sigma));
    const double log_e1 = std::log(0.5) + log_erfc((z0 - j) / (std::sqrt(2.0) * sigma));
    const double log_s0 = log_t0 + (static_cast<double>(i) * i - i) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    log_a0 = log_add(log_a0, log_s0);
    log_a1 = log_add(log_a1, log_s1);
    const double total = log_add(log_a0, log_a1);
    if (log_s0 < last_s0 && log_s1 < last_s1 && std::max(log_s0, log_s1) < total - 30) {
      return total;
    }
    last_s0 = log_s0;
    last_s1 = log_s1;
  }
  return kInf;
}

}  // namespace

std::vector<double> default_rdp_orders() {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1.0 + x / 10.0);
  for (int a = 12; a < 64; ++a) orders.push_back(a);
  for (double a : {128.0, 256.0, 512.0}) orders.push_back(a);
  return orders;
}

double rdp_subsampled_gaussian(double q, double sigma, double order) {
  if (std::isinf(order) || sigma == 0) return kInf;
  if (q == 0) return 0.0;
  if (q == 1.0) return order / (2.0 * sigma * sigma);
  const double log_a = order == std::floor(order) ? log_a_int(q, sigma, static_cast<int>(order))
                                                  : log_a_frac(q, sigma, order);
  return log_a / (order - 1.0);
}

PrivacySpent epsilon_from_rdp(std::span<const double> orders, std::span<const double> rdp,
                              double delta) {
  PrivacySpent best{kInf, 0.0};
  for (size_t k = 0; k < orders.size(); ++k) {
    const double a = orders[k];
    const double r = rdp[k];
    double eps = kInf;
    if (delta * delta + std::expm1(-r) > 0) {
      eps = 0.0;  // the KL bound already gives delta
    } else if (a > 1.01) {
      eps = r + std::log1p(-1.0 / a) - std::log(delta * a) / (a - 1.0);
    }
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

RdpAccountant::RdpAccountant(std::vector<double> orders)
    : orders_(std::move(orders)), rdp_(orders_.size(), 0.0) {}

void RdpAccountant::compose(double q, double sigma, uint64_t steps) {
  for (size_t k = 0; k < orders_.size(); ++k) {
    rdp_[k] += static_cast<double>(steps) * rdp_subsampled_gaussian(q, sigma, orders_[k]);
  }
}

Status RdpAccountant::restore(std::vector<double> rdp) {
  if (rdp.size() != orders_.size()) {
    return invalid_argument("DP accountant state has " + std::to_string(rdp.size()) +
                            " RDP values for " + std::to_string(orders_.size()) + " orders");
  }
  for (double r : rdp) {
    if (!(r >= 0)) return invalid_argument("DP accountant state holds a negative or NaN RDP");
  }
  rdp_ = std::move(rdp);
  return ok_status();
}

NoiseSource NoiseSource::secure() { return NoiseSource(); }

Status NoiseSource::refill() {
  pool_.resize(4096);  // 32 KiB a call
  if (RAND_priv_bytes(reinterpret_cast<unsigned char*>(pool_.data()),
                      static_cast<int>(pool_.size() * sizeof(uint64_t))) != 1) {
    const unsigned long e = ERR_get_error();
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    pool_.clear();
    next_ = 0;
    return internal_error(std::string("DP noise: OpenSSL's DRBG failed: ") + buf);
  }
  next_ = 0;
  return ok_status();
}

Result<uint64_t> NoiseSource::next_u64() {
  if (seeded_) return rng_.next_u64();
  if (next_ >= pool_.size()) RETURN_IF_ERROR(refill());
  return pool_[next_++];
}

Result<double> NoiseSource::uniform() {
  ASSIGN_OR_RETURN(const uint64_t x, next_u64());
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

Status NoiseSource::add_gaussian(std::span<float> v, double stddev) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < v.size(); i += 2) {
    double u1 = 0.0;
    do {
      ASSIGN_OR_RETURN(u1, uniform());
    } while (u1 <= 0.0);
    ASSIGN_OR_RETURN(const double u2, uniform());
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[i] = static_cast<float>(v[i] + stddev * r * std::cos(kTwoPi * u2));
    if (i + 1 < v.size())
      v[i + 1] = static_cast<float>(v[i + 1] + stddev * r * std::sin(kTwoPi * u2));
  }
  return ok_status();
}

Result<std::vector<size_t>> poisson_sample(size_t available, double q, NoiseSource& source) {
  std::vector<size_t> picked;
  for (size_t i = 0; i < available; ++i) {
    ASSIGN_OR_RETURN(const double u, source.uniform());
    if (u < q) picked.push_back(i);
  }
  return picked;
}

std::string rdp_to_text(std::span<const double> rdp) {
  std::string out;
  char buf[64];
  for (size_t k = 0; k < rdp.size(); ++k) {
    if (k) out.push_back(',');
    if (std::isinf(rdp[k])) {
      out += "inf";
    } else {
      std::snprintf(buf, sizeof(buf), "%a", rdp[k]);
      out += buf;
    }
  }
  return out;
}

Result<std::vector<double>> rdp_from_text(const std::string& text) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    if (item == "inf") {
      out.push_back(kInf);
    } else {
      char* stop = nullptr;
      const double v = std::strtod(item.c_str(), &stop);
      if (item.empty() || stop != item.c_str() + item.size() || !(v >= 0)) {
        return data_loss("DP accountant state: '" + item + "' is not a non-negative number");
      }
      out.push_back(v);
    }
    start = end + 1;
  }
  return out;
}

double rdp_skellam(double order, double l1, double l2, double variance) {
  if (variance <= 0) return std::numeric_limits<double>::infinity();
  const double a = order;
  return a * l2 * l2 / (2 * variance) +
         std::min(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * variance * variance),
                  3 * l1 / (2 * variance));
}

double rdp_poisson_subsampled(int order, double q, const std::function<double(int)>& eps) {
  const double full = eps(order);
  if (q >= 1) return full;
  if (q <= 0) return 0.0;
  const double a = order;
  auto log_comb = [](double n, double k) {
    return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
  };
  // log of (1-q)^(a-1) (a q - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^eps(2)
  //        + 3 sum_{l=3..a} C(a,l) (1-q)^(a-l) q^l e^((l-1) eps(l)).
  double total = (a - 1) * std::log1p(-q) + std::log(a * q - q + 1);
  total = log_add(total, log_comb(a, 2) + 2 * std::log(q) + (a - 2) * std::log1p(-q) + eps(2));
  for (int l = 3; l <= order; ++l) {
    total = log_add(total, std::log(3.0) + log_comb(a, l) + (a - l) * std::log1p(-q) +
                               l * std::log(q) + (l - 1) * eps(l));
  }
  return std::min(full, total / (a - 1));
}

std::vector<double> integer_rdp_orders() {
  std::vector<double> o;
  for (int k = 2; k <= 128; ++k) o.push_back(k);
  o.push_back(256);
  return o;
}

SkellamAccountant::SkellamAccountant() : RdpAccountant(integer_rdp_orders()) {}

void SkellamAccountant::compose(double q, double l1, double l2, double variance) {
  auto eps = [&](int order) { return rdp_skellam(order, l1, l2, variance); };
  for (size_t i = 0; i < orders_.size(); ++i) {
    rdp_[i] += rdp_poisson_subsampled(static_cast<int>(orders_[i]), q, eps);
  }
}

}  // namespace starling::aggregator
