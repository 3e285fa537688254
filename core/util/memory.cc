// keep_freed_memory (memory.h): glibc's mallopt.
#include "core/util/memory.h"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace starling::util {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  constexpr int kMmapThreshold = 32 << 20;  // glibc's largest on 64-bit
  constexpr int kTrimThreshold = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace starling::util
