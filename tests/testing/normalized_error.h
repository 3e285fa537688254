// The error measure of the parity tests: the largest absolute difference over the largest
// magnitude of the reference, so that tiny reference values do not dominate.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace starling::testing {

// max |got - want| / max |want| over n values.
inline double normalized_error(const float* got, const float* want, size_t n) {
  double err = 0.0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return err / scale;
}

}  // namespace starling::testing
