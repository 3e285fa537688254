// Length-prefixed framing.
#include "core/wire/frame.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace starling::wire {
namespace {

uint32_t read_be32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

}  // namespace

Status append_frame(std::string& out, std::string_view payload, uint32_t max_bytes) {
  if (payload.size() > max_bytes) {
    return invalid_argument("frame of " + std::to_string(payload.size()) +
                            " bytes exceeds the limit of " + std::to_string(max_bytes));
  }
  const auto n = static_cast<uint32_t>(payload.size());
  const char header[kFrameHeaderBytes] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                                          static_cast<char>(n >> 8), static_cast<char>(n)};
  out.append(header, kFrameHeaderBytes);
  out.append(payload);
  return ok_status();
}

Status FrameDecoder::check_header() {
  if (!error_.ok() || buffered_bytes() < kFrameHeaderBytes) return error_;
  const uint32_t n = read_be32(buffer_.get() + consumed_);
  if (n > max_bytes_) {
    error_ = data_loss("frame length " + std::to_string(n) + " exceeds the limit of " +
                       std::to_string(max_bytes_) + " bytes");
  }
  return error_;
}

void FrameDecoder::reserve_tail(size_t n) {
  // Compact before growing so the buffer holds at most one frame plus one read.
  if (consumed_ == size_) {
    size_ = 0;
    consumed_ = 0;
  } else if (consumed_ > 0 && (consumed_ > size_ / 2 || size_ + n > capacity_)) {
    std::memmove(buffer_.get(), buffer_.get() + consumed_, size_ - consumed_);
    size_ -= consumed_;
    consumed_ = 0;
  }
  if (size_ + n <= capacity_) return;
  size_t capacity = std::max(size_ + n, capacity_ * 2);
  if (size_ - consumed_ >= kFrameHeaderBytes) {
    // The frame's length is known: room for all of it and one more read of this size at once,
    // rather than doubling step by step (and ending at twice the frame).
    const uint32_t frame = read_be32(buffer_.get() + consumed_);
    if (frame <= max_bytes_) {
      capacity = std::max(size_ + n, consumed_ + kFrameHeaderBytes + size_t{frame} + n);
    }
  }
  auto bigger = std::make_unique_for_overwrite<char[]>(capacity);
  if (size_ > 0) std::memcpy(bigger.get(), buffer_.get(), size_);
  buffer_ = std::move(bigger);
  capacity_ = capacity;
}

void FrameDecoder::release() {
  if (size_ != consumed_) return;
  buffer_.reset();
  size_ = 0;
  consumed_ = 0;
  capacity_ = 0;
}

Status FrameDecoder::feed(std::string_view data) {
  if (!error_.ok()) return error_;
  reserve_tail(data.size());
  if (!data.empty()) std::memcpy(buffer_.get() + size_, data.data(), data.size());
  size_ += data.size();
  return check_header();
}

std::span<char> FrameDecoder::prepare(size_t n) {
  reserve_tail(n);
  return {buffer_.get() + size_, n};
}

Status FrameDecoder::commit(size_t n) {
  if (!error_.ok()) return error_;
  if (size_ + n > capacity_) return internal_error("frame decoder: commit beyond prepare()");
  size_ += n;
  return check_header();
}

size_t FrameDecoder::frame_missing() const {
  if (!error_.ok() || buffered_bytes() < kFrameHeaderBytes) return 0;
  const size_t whole = kFrameHeaderBytes + read_be32(buffer_.get() + consumed_);
  return whole > buffered_bytes() ? whole - buffered_bytes() : 0;
}

Result<std::optional<std::string_view>> FrameDecoder::next() {
  using Frame = std::optional<std::string_view>;
  RETURN_IF_ERROR(check_header());
  if (buffered_bytes() < kFrameHeaderBytes) return Frame();
  const uint32_t n = read_be32(buffer_.get() + consumed_);
  if (buffered_bytes() - kFrameHeaderBytes < n) return Frame();
  const std::string_view frame(buffer_.get() + consumed_ + kFrameHeaderBytes, n);
  consumed_ += kFrameHeaderBytes + n;
  return Frame(frame);
}

}  // namespace starling::wire
