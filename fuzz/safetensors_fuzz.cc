// libFuzzer target: a checkpoint file's bytes (a model download, a file on disk).
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = starling::io::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
  (void)f;
  return 0;
}
