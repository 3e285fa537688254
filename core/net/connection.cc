// Connection: read loop, write queue and deadlines. Every asynchronous handler holds a
// shared_ptr to the connection, so it lives until the last handler has run.
#include "core/net/connection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/error.hpp>
#include <asio/ssl/error.hpp>
#include <asio/write.hpp>
#include <span>
#include <vector>

#include "core/wire/envelope.h"

namespace starling::net {

using Clock = std::chrono::steady_clock;

Connection::Connection(std::unique_ptr<SslStream> stream, PeerIdentity peer,
                       ConnectionOptions options)
    : stream_(std::move(stream)),
      peer_(std::move(peer)),
      options_(options),
      decoder_(options.max_frame_bytes),
      read_timer_(stream_->get_executor()),
      write_timer_(stream_->get_executor()),
      trim_timer_(stream_->get_executor()) {}

Connection::~Connection() {
  asio::error_code ignored;
  stream_->lowest_layer().close(ignored);
}

void Connection::start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  if (started_ || closed_) return;
  started_ = true;
  arm_read_deadline();
  do_read();
  if (writing_count_ == 0 && !queue_.empty()) do_write();
}

namespace {

// What one read within a frame asks for: at least a TLS record, at most what remains of the
// frame up to kMaxReadBytes (a read returns the records that have arrived, so a large frame
// comes in a few reads rather than one per 16 KiB record).
constexpr size_t kReadBytes = 16 * 1024;
constexpr size_t kMaxReadBytes = 256 * 1024;
// Written frames kept per connection for reuse (none larger than the frame limit).
constexpr size_t kMaxSpareFrames = 4;
// A direction (reads, writes) quiet for this long frees its frame buffers.
constexpr auto kTrimAfter = std::chrono::milliseconds(500);

}  // namespace

void Connection::do_read() {
  if (!decoder_.mid_frame()) {
    // Between frames: into the small fixed buffer, leaving the decoder's free to be released
    // if the connection stays quiet. Its bytes are then fed to the decoder (at most 4 KiB).
    reading_idle_ = true;
    arm_trim();
    stream_->async_read_some(asio::buffer(idle_read_),
                             [self = shared_from_this()](const asio::error_code& ec, size_t n) {
                               self->on_read(ec, n);
                             });
    return;
  }
  // Within a frame: straight into the frame decoder's buffer, no copy between TLS and framing.
  reading_idle_ = false;
  const std::span<char> room =
      decoder_.prepare(std::clamp(decoder_.frame_missing(), kReadBytes, kMaxReadBytes));
  stream_->async_read_some(
      asio::buffer(room.data(), room.size()),
      [self = shared_from_this()](const asio::error_code& ec, size_t n) { self->on_read(ec, n); });
}

void Connection::on_read(const asio::error_code& ec, size_t n) {
  if (closed_) return;
  if (ec) {
    if (shutting_down_) return;  // the shutdown path finishes the connection
    const bool closed_by_peer = ec == asio::error::eof ||
                                ec == asio::ssl::error::stream_truncated ||
                                ec == asio::error::connection_reset;
    if (closed_by_peer && decoder_.mid_frame()) {
      fail(data_loss("peer " + peer_.describe() + " closed the connection in the middle of a " +
                     "frame (" + std::to_string(decoder_.buffered_bytes()) + " bytes received)"));
    } else if (ec == asio::error::eof) {
      teardown(ok_status());
    } else {
      fail(net_error("read from", peer_.describe(), ec, stream_->native_handle()));
    }
    return;
  }
  if (closing_) return;  // draining our queue; stop delivering (a failure may have closed us)
  const Status s = consume(n);
  if (!s.ok()) {
    // A bad frame: tell the peer why, then close. The close handler gets the error.
    v1::Envelope notice;
    notice.mutable_error()->set_code(v1::ERROR_CODE_BAD_REQUEST);
    notice.mutable_error()->set_message(s.message());
    close_status_ = s;
    (void)send(notice);
    close();
    return;
  }
  if (closing_ || closed_) return;  // a handler closed the connection
  arm_read_deadline();
  do_read();
}

Status Connection::consume(size_t n) {
  last_read_ = Clock::now();
  RETURN_IF_ERROR(
      reading_idle_ ? decoder_.feed(std::string_view(idle_read_.data(), n)) : decoder_.commit(n),
      "frame from " + peer_.describe());
  for (;;) {
    auto frame = decoder_.next();
    RETURN_IF_ERROR(frame, "frame from " + peer_.describe());
    if (!frame->has_value()) break;
    frame_in_progress_ = false;
    RETURN_IF_ERROR(deliver(**frame));
    if (closing_ || closed_) return ok_status();
  }
  if (decoder_.mid_frame() && !frame_in_progress_) {
    // The per-frame deadline runs from a frame's first byte, so a trickle cannot extend it.
    frame_in_progress_ = true;
    frame_deadline_ = Clock::now() + options_.deadlines.frame;
  }
  return ok_status();
}

Status Connection::deliver(std::string_view frame) {
  if (on_chunk_) {
    if (const auto chunk = wire::parse_chunk_envelope(frame)) {
      on_chunk_(*chunk);
      return ok_status();
    }
  }
  auto envelope = wire::decode_envelope(frame);
  if (envelope.status().code() == StatusCode::kUnimplemented) {
    // A newer peer's message type: say so and carry on, the stream itself is intact.
    v1::Envelope notice;
    notice.mutable_error()->set_code(v1::ERROR_CODE_UNKNOWN_MESSAGE);
    notice.mutable_error()->set_message(envelope.status().message());
    (void)send(notice);
    return ok_status();
  }
  RETURN_IF_ERROR(envelope, "message from " + peer_.describe());
  if (on_chunk_ && envelope->has_chunk()) {
    // A chunk in an encoding the fast parser leaves to protobuf (e.g. with unknown fields).
    on_chunk_(wire::view_of(envelope->chunk()));
  } else if (on_message_) {
    on_message_(std::move(*envelope));
  }
  return ok_status();
}

void Connection::arm_read_deadline() {
  // Re-arming a timer costs syscalls, so on most reads only the target moves; the timer is
  // reset only when the target comes earlier, and on expiry it checks the current target.
  read_deadline_ = frame_in_progress_ ? frame_deadline_ : Clock::now() + options_.deadlines.idle;
  if (read_timer_armed_ && read_timer_.expiry() <= read_deadline_) return;
  read_timer_armed_ = true;
  read_timer_.expires_at(read_deadline_);
  wait_read_deadline();
}

void Connection::set_idle_deadline(Millis idle) {
  options_.deadlines.idle = idle;
  if (frame_in_progress_ || !read_timer_armed_ || closed_) return;
  read_deadline_ = Clock::now() + idle;
  if (read_timer_.expiry() <= read_deadline_) return;  // it fires earlier and looks again
  read_timer_.expires_at(read_deadline_);
  wait_read_deadline();
}

void Connection::arm_trim() {
  if (trim_armed_ || closed_ || (decoder_.capacity() == 0 && spare_.empty())) return;
  trim_armed_ = true;
  trim_timer_.expires_at(
      std::max(std::min(last_read_, last_write_), Clock::now() - kTrimAfter / 2) + kTrimAfter);
  trim_timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    self->trim_armed_ = false;
    if (!ec) self->on_trim();
  });
}

size_t Connection::buffer_bytes() const {
  size_t n = decoder_.capacity();
  for (const auto& f : spare_) n += f.capacity();
  for (const auto& f : queue_) n += f.capacity();
  return n;
}

void Connection::on_trim() {
  if (closed_) return;
  // Each direction on its own: a connection that streams an upload right after a download
  // gives back the download's frames while it reads.
  const auto now = Clock::now();
  if (reading_idle_ && !decoder_.mid_frame() && now - last_read_ >= kTrimAfter) {
    decoder_.release();
  }
  if (writing_count_ == 0 && queue_.empty() && now - last_write_ >= kTrimAfter) {
    spare_.clear();
    spare_.shrink_to_fit();
  }
  arm_trim();  // whatever is still held: look again later
}

void Connection::wait_read_deadline() {
  read_timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (ec || self->closed_ || self->shutting_down_) return;
    if (Clock::now() < self->read_deadline_) {
      self->read_timer_.expires_at(self->read_deadline_);
      return self->wait_read_deadline();
    }
    const bool mid = self->frame_in_progress_;
    const auto limit = mid ? self->options_.deadlines.frame : self->options_.deadlines.idle;
    // Bytes waiting on the socket, or read from it and not yet handed over: the peer spoke,
    // and this thread was busy (a client trains on its I/O thread) and has not taken them
    // yet. Not idle; look again a deadline from now.
    asio::error_code avail_ec;
    const bool spoke = self->stream_->read_in_hand() ||
                       (self->stream_->lowest_layer().available(avail_ec) > 0 && !avail_ec);
    if (!mid && spoke) {
      self->read_deadline_ = Clock::now() + limit;
      self->read_timer_.expires_at(self->read_deadline_);
      return self->wait_read_deadline();
    }
    self->fail(deadline_exceeded(std::string(mid ? "frame from " : "no frame from ") +
                                 self->peer_.describe() + (mid ? " incomplete after " : " for ") +
                                 std::to_string(limit.count()) + " ms"));
  });
}

std::string Connection::take_spare() {
  if (spare_.empty()) return {};
  std::string f = std::move(spare_.back());
  spare_.pop_back();
  f.clear();
  return f;
}

Status Connection::send(const v1::Envelope& envelope) {
  if (closing_ || closed_) {
    return failed_precondition("connection to " + peer_.describe() + " is closed");
  }
  std::string frame = take_spare();
  RETURN_IF_ERROR(wire::append_framed_envelope(frame, envelope, options_.max_frame_bytes),
                  "send to " + peer_.describe());
  return enqueue(std::move(frame));
}

Status Connection::send_chunk(const wire::ChunkView& chunk) {
  if (closing_ || closed_) {
    return failed_precondition("connection to " + peer_.describe() + " is closed");
  }
  const size_t size = wire::kFrameHeaderBytes + wire::chunk_envelope_size(chunk);
  if (!queue_.empty() && queued_bytes_ + size > options_.max_queue_bytes) {
    return resource_exhausted("send queue to " + peer_.describe() + " is full (" +
                              std::to_string(queued_bytes_) + " bytes)");
  }
  std::string frame = take_spare();
  RETURN_IF_ERROR(wire::append_chunk_frame(frame, chunk, options_.max_frame_bytes),
                  "send to " + peer_.describe());
  return enqueue(std::move(frame));
}

Status Connection::enqueue(std::string frame) {
  const size_t size = frame.size();
  if (!queue_.empty() && queued_bytes_ + size > options_.max_queue_bytes) {
    if (spare_.size() < kMaxSpareFrames) spare_.push_back(std::move(frame));
    return resource_exhausted("send queue to " + peer_.describe() + " is full (" +
                              std::to_string(queued_bytes_) + " bytes)");
  }
  queue_.push_back(std::move(frame));
  queued_bytes_ += size;
  if (writing_count_ == 0) do_write();
  return ok_status();
}

void Connection::do_write() {
  if (closed_ || queue_.empty()) return;
  std::vector<asio::const_buffer> buffers;
  for (const auto& f : queue_) {
    if (buffers.size() == 64) break;
    buffers.push_back(asio::buffer(f));
  }
  writing_count_ = buffers.size();
  write_timer_.expires_after(options_.deadlines.frame);
  write_timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (ec || self->closed_ || self->write_timer_.expiry() > Clock::now()) return;
    self->fail(deadline_exceeded("write to " + self->peer_.describe() + " stalled for " +
                                 std::to_string(self->options_.deadlines.frame.count()) + " ms"));
  });
  asio::async_write(
      *stream_, buffers, [self = shared_from_this()](const asio::error_code& ec, size_t) {
        if (self->closed_) {
          self->queue_.clear();  // the frames teardown kept for this write
          self->writing_count_ = 0;
          return;
        }
        self->write_timer_.cancel();
        self->last_write_ = Clock::now();
        if (ec) {
          self->fail(
              net_error("write to", self->peer_.describe(), ec, self->stream_->native_handle()));
          return;
        }
        for (size_t i = 0; i < self->writing_count_; ++i) {
          std::string& f = self->queue_.front();
          self->queued_bytes_ -= f.size();
          if (self->spare_.size() < kMaxSpareFrames &&
              f.capacity() <= size_t{self->options_.max_frame_bytes} + wire::kFrameHeaderBytes) {
            self->spare_.push_back(std::move(f));
          }
          self->queue_.pop_front();
        }
        self->writing_count_ = 0;
        if (!self->queue_.empty()) {
          self->do_write();
        } else if (self->closing_) {
          self->begin_shutdown();
        } else {
          if (self->on_drain_) self->on_drain_();
          if (self->queue_.empty()) self->arm_trim();
        }
      });
}

void Connection::close() {
  if (closing_ || closed_) return;
  closing_ = true;
  if (writing_count_ == 0 && !queue_.empty()) {
    do_write();
  } else if (writing_count_ == 0) {
    begin_shutdown();
  }
}

void Connection::abort(const Status& reason) { fail(reason); }

void Connection::begin_shutdown() {
  if (shutting_down_ || closed_) return;
  shutting_down_ = true;
  read_timer_.cancel();
  // The pending read would compete with the shutdown for the peer's close_notify: end it.
  asio::error_code ignored;
  stream_->lowest_layer().cancel(ignored);
  write_timer_.expires_after(options_.deadlines.frame);
  write_timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (!ec) self->teardown(self->close_status_);
  });
  stream_->async_shutdown([self = shared_from_this()](const asio::error_code&) {
    self->teardown(self->close_status_);
  });
}

void Connection::fail(const Status& reason) {
  if (closed_) return;
  spdlog::debug("net: {}", reason.to_string());
  teardown(reason);
}

void Connection::teardown(const Status& reason) {
  if (closed_) return;
  closed_ = true;
  closing_ = true;
  asio::error_code ignored;
  read_timer_.cancel();
  write_timer_.cancel();
  trim_timer_.cancel();
  stream_->lowest_layer().close(ignored);
  // Frames handed to async_write stay alive until its handler runs: the composed write may still
  // call SSL_write on them (a partial write in progress) after the socket is closed.
  queue_.erase(
      queue_.begin() + static_cast<std::ptrdiff_t>(std::min(writing_count_, queue_.size())),
      queue_.end());
  spare_.clear();
  queued_bytes_ = 0;
  // Handlers may hold a shared_ptr to this connection: release them to break the cycle.
  auto on_close = std::move(on_close_);
  on_message_ = nullptr;
  on_drain_ = nullptr;
  if (auto hook = std::move(teardown_hook_)) hook();
  if (on_close) on_close(reason);
}

}  // namespace starling::net
