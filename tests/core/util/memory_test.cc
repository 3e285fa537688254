// keep_freed_memory: glibc accepts the settings, a step-sized block comes from the heap rather
// than its own mapping, and a block freed between two steps is reused rather than unmapped and
// faulted in again.
#include "core/util/memory.h"

#include <catch2/catch.hpp>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace starling::util {
namespace {

// Minor page faults of this process so far (field 10 of /proc/self/stat).
[[maybe_unused]] long minor_faults() {
  std::ifstream f("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  REQUIRE(close != std::string::npos);
  const char* p = stat.c_str() + close + 2;  // field 3 onwards
  for (int field = 3; field < 10; ++field) p = std::strchr(p, ' ') + 1;
  return std::strtol(p, nullptr, 10);
}

// Sanitizers replace the allocator (GCC's macros, clang's features).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STARLING_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STARLING_SANITIZED_ALLOCATOR 1
#endif
#endif

TEST_CASE("keep_freed_memory keeps a step's freed buffers mapped", "[util]") {
#if defined(STARLING_SANITIZED_ALLOCATOR)
  // A sanitizer's allocator takes no glibc settings, and the call says so.
  CHECK_FALSE(keep_freed_memory());
#elif defined(__GLIBC__)
  REQUIRE(keep_freed_memory());
  constexpr size_t kBytes = size_t{24} << 20;  // above glibc's default mmap threshold (128 KiB)
  // Not a mapping of its own (glibc's default would map it, and unmap it when freed).
  const size_t mapped = mallinfo2().hblkhd;
  void* block = std::malloc(kBytes);
  REQUIRE(block != nullptr);
  CHECK(mallinfo2().hblkhd == mapped);
  std::free(block);
  // The first "step" maps the block; the next ones reuse it without faulting its pages in.
  auto step = [] {
    auto* p = static_cast<char*>(std::malloc(kBytes));
    REQUIRE(p != nullptr);
    std::memset(p, 1, kBytes);
    const char v = p[kBytes - 1];
    std::free(p);
    return v;
  };
  REQUIRE(step() == 1);
  const long before = minor_faults();
  for (int i = 0; i < 4; ++i) REQUIRE(step() == 1);
  // 4 steps of 6144 pages each would fault 24576 times if the block were unmapped each time.
  CHECK(minor_faults() - before < 1000);
#else
  SUCCEED("not glibc: no settings to check");
#endif
}

}  // namespace
}  // namespace starling::util
