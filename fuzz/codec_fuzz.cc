// libFuzzer target: an encoded update from a client, parsed and folded into a destination the
// way the aggregator does. decode_add must reject, never crash or write out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto update =
      starling::compress::parse_update(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!update.ok()) return 0;
  if (update->numel < 0 || update->numel > (1 << 20)) return 0;  // the aggregator knows numel
  std::vector<float> dst(static_cast<size_t>(update->numel), 1.0f);
  (void)starling::compress::decode_add(*update, dst, 0.5f);
  return 0;
}
