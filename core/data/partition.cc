// Client partitions.
#include "core/data/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace starling::data {
namespace {

void shuffle(std::vector<int64_t>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    std::swap(v[i - 1], v[static_cast<size_t>(rng.below(i))]);
  }
}

}  // namespace

double sample_gamma(Rng& rng, double shape) {
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a).
    double u = 0.0;
    do {
      u = rng.uniform();
    } while (u <= 0.0);
    return sample_gamma(rng, shape + 1.0) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0.0;
    double v = 0.0;
    do {
      x = rng.normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = rng.uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (u > 0.0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

Partition partition_iid(int64_t n, int clients, uint64_t seed) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  Rng rng(seed);
  shuffle(idx, rng);
  Partition out(static_cast<size_t>(clients));
  const int64_t base = n / clients;
  const int64_t extra = n % clients;
  int64_t at = 0;
  for (int c = 0; c < clients; ++c) {
    const int64_t size = base + (c < extra ? 1 : 0);
    out[static_cast<size_t>(c)].assign(idx.begin() + at, idx.begin() + at + size);
    at += size;
  }
  return out;
}

Result<Partition> partition_dirichlet(std::span<const int32_t> labels, int clients, double alpha,
                                      uint64_t seed, int64_t min_size) {
  if (clients < 1 || !(alpha > 0.0)) {
    return invalid_argument("dirichlet partition needs clients >= 1 and alpha > 0");
  }
  int32_t num_classes = 0;
  for (int32_t l : labels) num_classes = std::max(num_classes, l + 1);
  std::vector<std::vector<int64_t>> by_class(static_cast<size_t>(num_classes));
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0) return invalid_argument("negative label at " + std::to_string(i));
    by_class[static_cast<size_t>(labels[i])].push_back(static_cast<int64_t>(i));
  }
  Rng rng(seed);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Partition out(static_cast<size_t>(clients));
    for (auto members : by_class) {
      shuffle(members, rng);
      std::vector<double> p(static_cast<size_t>(clients));
      double total = 0.0;
      for (auto& x : p) total += (x = sample_gamma(rng, alpha));
      double cum = 0.0;
      size_t start = 0;
      for (int c = 0; c < clients; ++c) {
        cum += p[static_cast<size_t>(c)] / total;
        const size_t end =
            c + 1 == clients
                ? members.size()
                : std::min(
                      members.size(),
                      static_cast<size_t>(std::llround(cum * static_cast<double>(members.size()))));
        if (end > start) {
          auto& dst = out[static_cast<size_t>(c)];
          dst.insert(dst.end(), members.begin() + static_cast<int64_t>(start),
                     members.begin() + static_cast<int64_t>(end));
          start = end;
        }
      }
    }
    const bool big_enough = std::all_of(out.begin(), out.end(), [&](const auto& v) {
      return static_cast<int64_t>(v.size()) >= min_size;
    });
    if (big_enough) {
      for (auto& v : out) std::sort(v.begin(), v.end());
      return out;
    }
  }
  return failed_precondition("dirichlet partition: no draw gave every client " +
                             std::to_string(min_size) + " examples; raise alpha");
}

Result<Partition> partition_shards(std::span<const int32_t> labels, int clients,
                                   int shards_per_client, uint64_t seed) {
  if (clients < 1 || shards_per_client < 1) {
    return invalid_argument("shard partition needs clients >= 1 and shards_per_client >= 1");
  }
  const int64_t shards = static_cast<int64_t>(clients) * shards_per_client;
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n < shards) {
    return invalid_argument(std::to_string(n) + " examples cannot fill " + std::to_string(shards) +
                            " shards");
  }
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return labels[a] < labels[b]; });
  std::vector<int64_t> order(static_cast<size_t>(shards));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed);
  shuffle(order, rng);
  const int64_t shard_size = n / shards;
  Partition out(static_cast<size_t>(clients));
  for (int64_t s = 0; s < shards; ++s) {
    auto& dst = out[static_cast<size_t>(s / shards_per_client)];
    const int64_t from = order[static_cast<size_t>(s)] * shard_size;
    dst.insert(dst.end(), idx.begin() + from, idx.begin() + from + shard_size);
  }
  return out;
}

}  // namespace starling::data
