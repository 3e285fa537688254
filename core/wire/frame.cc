// Length-prefixed framing.
#include "core/wire/frame.h"

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
  const uint32_t n = read_be32(buffer_.data() + consumed_);
  if (n > max_bytes_) {
    error_ = data_loss("frame length " + std::to_string(n) + " exceeds the limit of " +
                       std::to_string(max_bytes_) + " bytes");
  }
  return error_;
}

Status FrameDecoder::feed(std::string_view data) {
  if (!error_.ok()) return error_;
  // Compact before growing so the buffer holds at most one frame plus one read.
  if (consumed_ > 0 && consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  } else if (consumed_ > buffer_.size() / 2) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(data);
  return check_header();
}

Result<std::optional<std::string_view>> FrameDecoder::next() {
  using Frame = std::optional<std::string_view>;
  RETURN_IF_ERROR(check_header());
  if (buffered_bytes() < kFrameHeaderBytes) return Frame();
  const uint32_t n = read_be32(buffer_.data() + consumed_);
  if (buffered_bytes() - kFrameHeaderBytes < n) return Frame();
  const std::string_view frame(buffer_.data() + consumed_ + kFrameHeaderBytes, n);
  consumed_ += kFrameHeaderBytes + n;
  return Frame(frame);
}

}  // namespace starling::wire
