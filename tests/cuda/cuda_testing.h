// Helpers for the [cuda] parity tests: skip without a GPU, random inputs exactly representable
// in f32, a float64 CPU reference through core/ops + autograd, and a normalized comparison.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/cuda/device.h"
#include "core/cuda/handles.h"
#include "core/tensor/tensor.h"
#include "core/util/rng.h"

// Skips the rest of the test (with a warning) where no GPU is visible, e.g. on CI builders;
// fails instead when STARLING_REQUIRE_GPU is set (bench/gpu_check.sh sets it), so a GPU machine
// with a broken driver cannot pass by skipping.
#define STARLING_REQUIRE_GPU()                                          \
  do {                                                                  \
    if (::starling::cuda::devices().empty()) {                          \
      if (std::getenv("STARLING_REQUIRE_GPU") != nullptr) {             \
        FAIL("no CUDA device visible and STARLING_REQUIRE_GPU is set"); \
      }                                                                 \
      WARN("no CUDA device visible: [cuda] test skipped");              \
      return;                                                           \
    }                                                                   \
  } while (0)

namespace starling::cuda::testing {

// n f32 values from N(0, scale^2), seeded.
inline std::vector<float> random_floats(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}

// The f32 values as an f64 CPU tensor (exact), optionally a leaf that requires grad.
inline Tensor f64(const std::vector<float>& v, const Shape& shape, bool requires_grad = false) {
  std::vector<double> d(v.begin(), v.end());
  Tensor t = Tensor::from_vector(d, shape);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// max |got - want| / max(max |want|, 1e-30) <= rel: every element within rel of the tensor's
// scale (a pure per-element relative test is meaningless next to values near zero).
inline void require_close(const std::vector<float>& got, const std::vector<double>& want,
                          double rel = 1e-5) {
  REQUIRE(got.size() == want.size());
  double err = 0.0, scale = 1e-30;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    if (e > err || std::isnan(e)) {
      err = std::isnan(e) ? INFINITY : e;
      worst = i;
    }
    scale = std::max(scale, std::abs(want[i]));
  }
  INFO("worst element " << worst << ": got " << (got.empty() ? 0.0 : got[worst]) << " want "
                        << (want.empty() ? 0.0 : want[worst]) << ", normalized error "
                        << err / scale);
  REQUIRE(err / scale <= rel);
}

inline std::vector<double> values(const Tensor& t) { return t.to_double_vector(); }

}  // namespace starling::cuda::testing
