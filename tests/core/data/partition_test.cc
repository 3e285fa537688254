// Client partitions: disjoint, seeded, with the promised label structure.
#include "core/data/partition.h"

#include <catch2/catch.hpp>
#include <set>

namespace starling::data {
namespace {

std::vector<int32_t> labels_of(int n, int classes) {
  std::vector<int32_t> l(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) l[static_cast<size_t>(i)] = (i * 7) % classes;
  return l;
}

void check_disjoint(const Partition& p, int64_t n, bool complete) {
  std::set<int64_t> seen;
  size_t total = 0;
  for (const auto& c : p) {
    for (int64_t i : c) {
      CHECK(i >= 0);
      CHECK(i < n);
      seen.insert(i);
    }
    total += c.size();
  }
  CHECK(seen.size() == total);
  if (complete) CHECK(static_cast<int64_t>(total) == n);
}

TEST_CASE("IID partitions are balanced, disjoint and seeded", "[data]") {
  const auto p = partition_iid(103, 10, 1);
  REQUIRE(p.size() == 10);
  for (const auto& c : p) CHECK((c.size() == 10 || c.size() == 11));
  check_disjoint(p, 103, true);
  CHECK(partition_iid(103, 10, 1) == p);
  CHECK(partition_iid(103, 10, 2) != p);
}

TEST_CASE("pathological shards give each client few labels", "[data]") {
  const auto labels = labels_of(1000, 10);
  auto p = partition_shards(labels, 50, 2, 3);
  REQUIRE(p.ok());
  check_disjoint(*p, 1000, true);
  for (const auto& c : *p) {
    CHECK(c.size() == 20);
    std::set<int32_t> classes;
    for (int64_t i : c) classes.insert(labels[static_cast<size_t>(i)]);
    CHECK(classes.size() <= 2);
  }
  CHECK_FALSE(partition_shards(labels_of(10, 2), 50, 2, 1).ok());
}

TEST_CASE("Dirichlet label skew grows as alpha shrinks", "[data]") {
  const auto labels = labels_of(2000, 10);
  auto skew = [&](double alpha) {
    auto p = partition_dirichlet(labels, 10, alpha, 4);
    REQUIRE(p.ok());
    check_disjoint(*p, 2000, true);
    // Mean over clients of the largest class share.
    double s = 0;
    for (const auto& c : *p) {
      std::vector<int> count(10);
      for (int64_t i : c) ++count[static_cast<size_t>(labels[static_cast<size_t>(i)])];
      s += double(*std::max_element(count.begin(), count.end())) / double(c.size());
    }
    return s / 10;
  };
  CHECK(skew(0.1) > skew(100.0));
  CHECK(skew(100.0) < 0.2);
  CHECK(partition_dirichlet(labels, 10, 0.5, 4).value() ==
        partition_dirichlet(labels, 10, 0.5, 4).value());
  CHECK_FALSE(partition_dirichlet(labels, 10, 0.0, 4).ok());
}

TEST_CASE("gamma samples have the right mean", "[data]") {
  const double shape = GENERATE(0.3, 1.0, 4.0);
  Rng rng(9);
  double s = 0;
  for (int i = 0; i < 20000; ++i) s += sample_gamma(rng, shape);
  CHECK(s / 20000 == Approx(shape).epsilon(0.05));
}

}  // namespace
}  // namespace starling::data
