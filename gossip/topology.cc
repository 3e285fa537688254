// Graph construction, Metropolis-Hastings weights and the Jacobi eigenvalue solver.
#include "gossip/topology.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "core/util/rng.h"

namespace starling::gossip {
namespace {

using Adjacency = std::vector<std::vector<int>>;

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

Adjacency from_sets(const std::vector<std::set<int>>& sets) {
  Adjacency adj(sets.size());
  for (size_t i = 0; i < sets.size(); ++i) adj[i].assign(sets[i].begin(), sets[i].end());
  return adj;
}

void add_edge(std::vector<std::set<int>>& s, int a, int b) {
  if (a == b) return;
  s[static_cast<size_t>(a)].insert(b);
  s[static_cast<size_t>(b)].insert(a);
}

bool connected(const Adjacency& adj) {
  if (adj.empty()) return true;
  std::vector<char> seen(adj.size(), 0);
  std::vector<int> stack = {0};
  seen[0] = 1;
  size_t count = 1;
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    for (int u : adj[static_cast<size_t>(v)]) {
      if (!seen[static_cast<size_t>(u)]) {
        seen[static_cast<size_t>(u)] = 1;
        ++count;
        stack.push_back(u);
      }
    }
  }
  return count == adj.size();
}

// A uniformly paired random d-regular simple connected graph (pairing model with restarts).
Result<Adjacency> random_regular(int n, int d, uint64_t seed) {
  Rng rng(seed);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::vector<int> stubs;
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < d; ++k) stubs.push_back(i);
    }
    for (size_t i = stubs.size(); i > 1; --i) {
      std::swap(stubs[i - 1], stubs[static_cast<size_t>(rng.below(i))]);
    }
    std::vector<std::set<int>> s(static_cast<size_t>(n));
    bool simple = true;
    for (size_t i = 0; i + 1 < stubs.size() && simple; i += 2) {
      const int a = stubs[i], b = stubs[i + 1];
      if (a == b || s[static_cast<size_t>(a)].count(b)) simple = false;
      add_edge(s, a, b);
    }
    if (!simple) continue;
    Adjacency adj = from_sets(s);
    if (connected(adj)) return adj;
  }
  return failed_precondition("topology random_regular: no simple connected " + std::to_string(d) +
                             "-regular graph on " + std::to_string(n) +
                             " nodes found in 1000 draws");
}

int torus_rows_for(int n, int requested) {
  if (requested > 0) return requested;
  int best = 1;
  for (int r = 1; r * r <= n; ++r) {
    if (n % r == 0) best = r;
  }
  return best;
}

}  // namespace

std::string_view topology_name(TopologyKind kind) {
  switch (kind) {
    case TopologyKind::kRing:
      return "ring";
    case TopologyKind::kTorus:
      return "torus";
    case TopologyKind::kExponential:
      return "exponential";
    case TopologyKind::kRandomRegular:
      return "random_regular";
    case TopologyKind::kComplete:
      return "complete";
  }
  return "unknown";
}

Result<TopologyKind> parse_topology_kind(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (TopologyKind k : {TopologyKind::kRing, TopologyKind::kTorus, TopologyKind::kExponential,
                         TopologyKind::kRandomRegular, TopologyKind::kComplete}) {
    if (lower == topology_name(k)) return k;
  }
  return invalid_argument("unknown topology '" + std::string(name) +
                          "' (ring, torus, exponential, random_regular, complete)");
}

double MixingMatrix::weight(int i, int j) const {
  const MixingRow& r = rows[static_cast<size_t>(i)];
  const auto it = std::lower_bound(r.nodes.begin(), r.nodes.end(), j);
  if (it == r.nodes.end() || *it != j) return 0.0;
  return r.weights[static_cast<size_t>(it - r.nodes.begin())];
}

Result<Adjacency> neighbours(const TopologySpec& spec, int n, uint64_t round) {
  if (n < 1) return invalid_argument("topology: need at least one node, got " + std::to_string(n));
  std::vector<std::set<int>> s(static_cast<size_t>(n));
  switch (spec.kind) {
    case TopologyKind::kRing:
      for (int i = 0; i < n; ++i) add_edge(s, i, (i + 1) % n);
      break;
    case TopologyKind::kTorus: {
      const int rows = torus_rows_for(n, spec.torus_rows);
      if (n % rows != 0) {
        return invalid_argument("topology torus: torus_rows " + std::to_string(rows) +
                                " does not divide " + std::to_string(n) + " nodes");
      }
      const int cols = n / rows;
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) {
          const int i = r * cols + c;
          add_edge(s, i, r * cols + (c + 1) % cols);
          add_edge(s, i, ((r + 1) % rows) * cols + c);
        }
      }
      break;
    }
    case TopologyKind::kExponential:
      if (spec.time_varying) {
        const int tau = std::max(1, ceil_log2(n));
        const int hop = (1 << static_cast<int>(round % static_cast<uint64_t>(tau))) % n;
        for (int i = 0; i < n; ++i) add_edge(s, i, (i + hop) % n);
      } else {
        for (int i = 0; i < n; ++i) {
          for (int hop = 1; hop < n; hop *= 2) add_edge(s, i, (i + hop) % n);
        }
      }
      break;
    case TopologyKind::kRandomRegular: {
      if (n == 1) break;
      // The effective degree: at most n - 1, and n * d even (documented in TopologySpec).
      int d = std::min(spec.degree, n - 1);
      if ((n * d) % 2 != 0) --d;
      if (d < 1) return invalid_argument("topology random_regular: degree must be at least 1");
      if (d == n - 1) {
        for (int i = 0; i < n; ++i) {
          for (int j = i + 1; j < n; ++j) add_edge(s, i, j);
        }
        break;
      }
      const uint64_t seed =
          spec.time_varying ? Rng(spec.seed).fork(round + 1).next_u64() : Rng(spec.seed).next_u64();
      return random_regular(n, d, seed);
    }
    case TopologyKind::kComplete:
      for (int i = 0; i < n; ++i) {
        for (int j = i + 1; j < n; ++j) add_edge(s, i, j);
      }
      break;
  }
  return from_sets(s);
}

MixingMatrix metropolis_hastings(const Adjacency& adj) {
  MixingMatrix w;
  w.n = static_cast<int>(adj.size());
  w.rows.resize(adj.size());
  w.send_to = adj;
  for (size_t i = 0; i < adj.size(); ++i) {
    MixingRow& row = w.rows[i];
    double self = 1.0;
    for (int j : adj[i]) self -= mh_weight(adj[i].size(), adj[static_cast<size_t>(j)].size());
    bool placed = false;
    for (int j : adj[i]) {
      if (!placed && j > static_cast<int>(i)) {
        row.nodes.push_back(static_cast<int>(i));
        row.weights.push_back(self);
        placed = true;
      }
      row.nodes.push_back(j);
      row.weights.push_back(mh_weight(adj[i].size(), adj[static_cast<size_t>(j)].size()));
    }
    if (!placed) {
      row.nodes.push_back(static_cast<int>(i));
      row.weights.push_back(self);
    }
  }
  return w;
}

Result<MixingMatrix> mixing_matrix(const TopologySpec& spec, int n, uint64_t round) {
  if (spec.kind == TopologyKind::kExponential && spec.time_varying && n > 1) {
    const int tau = std::max(1, ceil_log2(n));
    const int hop = (1 << static_cast<int>(round % static_cast<uint64_t>(tau))) % n;
    MixingMatrix w;
    w.n = n;
    w.rows.resize(static_cast<size_t>(n));
    w.send_to.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      // Row i receives from i - hop; i sends to i + hop.
      const int from = ((i - hop) % n + n) % n;
      MixingRow& row = w.rows[static_cast<size_t>(i)];
      if (from == i) {
        row.nodes = {i};
        row.weights = {1.0};
      } else {
        row.nodes = {std::min(i, from), std::max(i, from)};
        row.weights = {0.5, 0.5};
      }
      const int to = (i + hop) % n;
      if (to != i) w.send_to[static_cast<size_t>(i)] = {to};
    }
    return w;
  }
  ASSIGN_OR_RETURN(auto adj, neighbours(spec, n, round));
  return metropolis_hastings(adj);
}

std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n) {
  const auto at = [&](int i, int j) -> double& {
    return a[static_cast<size_t>(i) * static_cast<size_t>(n) + static_cast<size_t>(j)];
  };
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) off += at(i, j) * at(i, j);
    }
    if (off < 1e-30) break;
    for (int p = 0; p < n; ++p) {
      for (int q = p + 1; q < n; ++q) {
        if (std::abs(at(p, q)) < 1e-300) continue;
        const double theta = (at(q, q) - at(p, p)) / (2.0 * at(p, q));
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < n; ++k) {
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = c * akp - s * akq;
          at(k, q) = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {
          const double apk = at(p, k), aqk = at(q, k);
          at(p, k) = c * apk - s * aqk;
          at(q, k) = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ev[static_cast<size_t>(i)] = at(i, i);
  std::sort(ev.begin(), ev.end(), std::greater<>());
  return ev;
}

Result<SpectralInfo> spectral_gap(const MixingMatrix& w) {
  const int n = w.n;
  std::vector<double> dense(static_cast<size_t>(n) * static_cast<size_t>(n), 0.0);
  for (int i = 0; i < n; ++i) {
    const MixingRow& r = w.rows[static_cast<size_t>(i)];
    for (size_t k = 0; k < r.nodes.size(); ++k) {
      dense[static_cast<size_t>(i * n + r.nodes[k])] = r.weights[k];
    }
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (std::abs(dense[static_cast<size_t>(i * n + j)] - dense[static_cast<size_t>(j * n + i)]) >
          1e-12) {
        return invalid_argument("spectral gap: mixing matrix is not symmetric at (" +
                                std::to_string(i) + ", " + std::to_string(j) + ")");
      }
    }
  }
  SpectralInfo info;
  if (n < 2) {
    info.gap = 1.0;
    return info;
  }
  const auto ev = symmetric_eigenvalues(std::move(dense), n);
  // ev[0] == 1 (the consensus direction); the contraction is the largest of the rest in size.
  info.lambda2 = std::max(std::abs(ev[1]), std::abs(ev.back()));
  info.gap = 1.0 - info.lambda2;
  return info;
}

std::vector<double> mix_once(const MixingMatrix& w, std::span<const double> x) {
  std::vector<double> y(x.size(), 0.0);
  for (int i = 0; i < w.n; ++i) {
    const MixingRow& r = w.rows[static_cast<size_t>(i)];
    double acc = 0.0;
    for (size_t k = 0; k < r.nodes.size(); ++k) {
      acc += r.weights[k] * x[static_cast<size_t>(r.nodes[k])];
    }
    y[static_cast<size_t>(i)] = acc;
  }
  return y;
}

}  // namespace starling::gossip
