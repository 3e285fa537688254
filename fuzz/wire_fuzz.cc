// libFuzzer target: bytes from a peer, fed to the frame decoder in fuzzer-chosen pieces, each
// complete frame decoded as an Envelope. Must never crash, leak or hang.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/wire/envelope.h"
#include "core/wire/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the piece size (1..256) so partial headers and frames are exercised.
  const size_t piece = static_cast<size_t>(data[0]) + 1;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  starling::wire::FrameDecoder dec(1u << 16);
  while (!rest.empty()) {
    const size_t n = rest.size() < piece ? rest.size() : piece;
    if (!dec.feed(rest.substr(0, n)).ok()) return 0;
    rest.remove_prefix(n);
    for (;;) {
      auto frame = dec.next();
      if (!frame.ok() || !frame->has_value()) break;
      auto env = starling::wire::decode_envelope(**frame);
      (void)env;
    }
  }
  return 0;
}
