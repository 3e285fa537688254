// Splitting a dataset among federated clients, seeded: IID, Dirichlet(alpha) label skew
// (Hsu et al. 2019) and McMahan et al.'s pathological shards (sorted by label, k shards each).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::data {

// Example indices of each client. Every index appears in at most one client.
using Partition = std::vector<std::vector<int64_t>>;

// A random permutation of [0, n) cut into `clients` parts whose sizes differ by at most one.
// REQUIRES: clients > 0.
Partition partition_iid(int64_t n, int clients, uint64_t seed);

// Per class, proportions over clients ~ Dirichlet(alpha); redrawn (up to 1000 times) until every
// client holds at least `min_size` examples. InvalidArgument for alpha <= 0 or clients < 1;
// FailedPrecondition when min_size cannot be met.
Result<Partition> partition_dirichlet(std::span<const int32_t> labels, int clients, double alpha,
                                      uint64_t seed, int64_t min_size = 1);

// Indices sorted by label, cut into clients * shards_per_client equal shards (the remainder is
// dropped), shards dealt to clients at random. InvalidArgument when there are fewer examples than
// shards.
Result<Partition> partition_shards(std::span<const int32_t> labels, int clients,
                                   int shards_per_client, uint64_t seed);

// Gamma(shape, 1) by Marsaglia and Tsang (2000). REQUIRES: shape > 0.
double sample_gamma(Rng& rng, double shape);

}  // namespace starling::data
