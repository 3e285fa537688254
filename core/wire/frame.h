// Framing: each message on a stream is a 4-byte big-endian length followed by that many bytes.
// FrameDecoder consumes bytes as they arrive and rejects a length above its hard limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace starling::wire {

inline constexpr size_t kFrameHeaderBytes = 4;
// Default hard limit for one frame; large payloads go as chunks (core/wire/chunking.h).
inline constexpr uint32_t kDefaultMaxFrameBytes = 16u << 20;

// Appends header + payload to `out`. Fails (InvalidArgument) when payload exceeds max_bytes.
Status append_frame(std::string& out, std::string_view payload,
                    uint32_t max_bytes = kDefaultMaxFrameBytes);

// Incremental decoder. Not thread-safe. After an error it stays failed: the stream is
// unrecoverable and the connection must be closed.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_bytes = kDefaultMaxFrameBytes) : max_bytes_(max_bytes) {}

  // Buffers `data`. Fails (DataLoss) once a header announces a frame above the limit.
  Status feed(std::string_view data);
  // Zero-copy alternative to feed(): a writable region of exactly `n` bytes at the end of the
  // buffer. Read into it, then commit() the bytes that arrived (at most n). The region is
  // valid until the next prepare() or feed().
  std::span<char> prepare(size_t n);
  Status commit(size_t n);
  // The next complete frame, std::nullopt when more bytes are needed, or the sticky error.
  // The view stays valid until the next call to feed() or prepare().
  Result<std::optional<std::string_view>> next();

  // True when some bytes of an incomplete frame are buffered (a close now truncates it).
  bool mid_frame() const { return size_ > consumed_; }
  size_t buffered_bytes() const { return size_ - consumed_; }
  // Bytes still to come of the frame in progress, once its header is buffered (else 0).
  size_t frame_missing() const;
  uint32_t max_bytes() const { return max_bytes_; }
  // Bytes allocated for the buffer (it grows to hold the largest frame plus one read).
  size_t capacity() const { return capacity_; }
  // Frees the buffer when it holds nothing (an idle stream keeps no frame-sized allocation);
  // the next prepare() or feed() allocates again. REQUIRES: no region from prepare() in use.
  void release();

 private:
  Status check_header();
  // Drops returned frames and makes room for `n` more bytes (without zero-filling them).
  void reserve_tail(size_t n);

  uint32_t max_bytes_;
  std::unique_ptr<char[]> buffer_;
  size_t size_ = 0;      // bytes held in buffer_
  size_t capacity_ = 0;  // bytes allocated
  size_t consumed_ = 0;  // bytes of buffer_ already returned as frames
  Status error_;
};

}  // namespace starling::wire
