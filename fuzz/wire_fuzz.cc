// libFuzzer target: bytes from a peer, fed to the frame decoder in fuzzer-chosen pieces, each
// complete frame decoded as an Envelope. Must never crash, leak or hang. The zero-copy chunk
// parser is checked against protobuf on every frame: whatever it accepts, protobuf must parse
// to the same chunk.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/wire/chunk_frame.h"
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
      if (const auto chunk = starling::wire::parse_chunk_envelope(**frame)) {
        if (!env.ok() || !env->has_chunk()) std::abort();
        const auto& c = env->chunk();
        if (c.transfer_id() != chunk->transfer_id || c.index() != chunk->index ||
            c.data() != chunk->data || c.crc32c() != chunk->crc32c) {
          std::abort();
        }
      }
    }
  }
  return 0;
}
