// Communication graphs of decentralized training (ring, 2-D torus, exponential graph, random
// d-regular, complete), static or changing each round, their mixing matrices (Metropolis-Hastings
// weights) and the spectral gap that predicts how fast gossip averaging reaches consensus.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::gossip {

enum class TopologyKind { kRing, kTorus, kExponential, kRandomRegular, kComplete };

std::string_view topology_name(TopologyKind kind);                // "ring", "torus", ...
Result<TopologyKind> parse_topology_kind(std::string_view name);  // case-insensitive

struct TopologySpec {
  TopologyKind kind = TopologyKind::kExponential;
  // Static: the same graph every round. Time-varying: exponential becomes the one-peer
  // exponential graph (round t: node i sends to i + 2^(t mod log2 n), weights 1/2, so n a power
  // of two averages exactly in log2 n rounds); random_regular draws a new graph each round
  // (seed, round); ring, torus and complete do not change.
  bool time_varying = false;
  int degree = 4;      // random d-regular: d (n * d must be even, d < n)
  int torus_rows = 0;  // torus: rows (0: the divisor of n nearest sqrt(n)); columns = n / rows
  uint64_t seed = 1;   // random d-regular
};

// A mixing matrix in sparse rows: node i's next value is sum_j w_ij x_j over row i (self included).
// Every row and every column sums to 1 (doubly stochastic); static graphs are symmetric.
struct MixingRow {
  std::vector<int> nodes;       // ascending, includes i
  std::vector<double> weights;  // same order
};
struct MixingMatrix {
  int n = 0;
  std::vector<MixingRow> rows;
  // Out-neighbours of each node (whom it sends to), excluding itself. Symmetric graphs: the same
  // as the in-neighbours of the row.
  std::vector<std::vector<int>> send_to;

  double weight(int i, int j) const;  // 0 when j is not in row i
};

// Undirected neighbour lists (no self loops, ascending) of `spec` on n nodes at `round`.
// InvalidArgument naming the constraint when n is too small, d*n is odd, d >= n, or a torus has
// no fitting shape (rows must divide n). For the time-varying exponential graph the lists are
// the union of in- and out-neighbours of that round.
Result<std::vector<std::vector<int>>> neighbours(const TopologySpec& spec, int n, uint64_t round);

// Metropolis-Hastings weights of an undirected graph: w_ij = 1 / (1 + max(d_i, d_j)) for an
// edge, w_ii = 1 - sum_j w_ij. Symmetric and doubly stochastic for any connected graph.
MixingMatrix metropolis_hastings(const std::vector<std::vector<int>>& adjacency);

// The mixing matrix of round `round`: Metropolis-Hastings of neighbours(), except the
// time-varying exponential graph, which is (I + P_k) / 2 for the shift P_k by 2^(round mod
// ceil(log2 n)).
Result<MixingMatrix> mixing_matrix(const TopologySpec& spec, int n, uint64_t round);

// Metropolis-Hastings weight of an edge between nodes of degrees d_i and d_j.
inline double mh_weight(size_t d_i, size_t d_j) {
  return 1.0 / (1.0 + static_cast<double>(d_i > d_j ? d_i : d_j));
}

// Eigenvalues of a dense symmetric matrix (row-major n x n), descending (cyclic Jacobi).
std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n);

struct SpectralInfo {
  double lambda2 = 0.0;  // second largest |eigenvalue| of W: the per-round contraction factor
  double gap = 0.0;      // 1 - lambda2
};
// For a symmetric mixing matrix: ||W^t x - mean||_2 <= lambda2^t ||x - mean||_2.
// InvalidArgument when W is not symmetric.
Result<SpectralInfo> spectral_gap(const MixingMatrix& w);

// x_i <- sum_j w_ij x_j for scalar node values (exact-averaging tests, decay experiments).
std::vector<double> mix_once(const MixingMatrix& w, std::span<const double> x);

}  // namespace starling::gossip
