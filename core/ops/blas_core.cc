// The OpenBLAS kernel report (blas_core.h). The core's name is looked up in the loaded libraries
// at run time, so that a build on another BLAS links the same and reports "unknown".
#include "core/ops/blas_core.h"

#include <dlfcn.h>

#include <cstdlib>

namespace starling::ops {

std::string blas_core() {
  using CoreName = char* (*)();
  const auto name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "gotoblas_corename"));
  std::string s = name != nullptr ? name() : "unknown";
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr) {
    s += std::string(" (OPENBLAS_CORETYPE=") + forced + ")";
  }
  return s;
}

}  // namespace starling::ops
