// Connection: one verified TLS stream carrying framed Envelopes, with a deadline beside every
// read and write, a bounded send queue, and exactly one close notification.
#pragma once

#include <array>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/net/tls.h"
#include "core/net/tls_stream.h"
#include "core/util/status.h"
#include "core/wire/chunk_frame.h"
#include "core/wire/frame.h"
#include "core/wire/messages.pb.h"

namespace starling::net {

using SslStream = TlsStream;
using Millis = std::chrono::milliseconds;

struct Deadlines {
  Millis connect{10'000};    // TCP connect (client)
  Millis handshake{10'000};  // TLS handshake
  // No new frame for this long: the peer is gone. Peers send Heartbeats more often than this.
  Millis idle{120'000};
  // A started frame must arrive whole, queued frames be written, the TLS close be answered.
  Millis frame{30'000};
};

struct ConnectionOptions {
  Deadlines deadlines;
  uint32_t max_frame_bytes = wire::kDefaultMaxFrameBytes;
  // send() refuses (ResourceExhausted) beyond this many queued bytes: the caller must wait
  // for the drain handler before sending more.
  size_t max_queue_bytes = 64u << 20;
};

// Not thread-safe: every call, and every handler, runs on the stream's executor (the
// io_context thread). Built by Server and connect() after a successful handshake.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Receives each well-formed message. A malformed frame or message closes the connection
  // (after an Error to the peer); a message type unknown to this build is answered with an
  // Error and skipped.
  using MessageHandler = std::function<void(v1::Envelope)>;
  // Called exactly once: OK after close() or a clean close by the peer (at a frame boundary,
  // with TLS close_notify); otherwise the error, which names the peer.
  using CloseHandler = std::function<void(const Status&)>;

  Connection(std::unique_ptr<SslStream> stream, PeerIdentity peer, ConnectionOptions options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Receives each Chunk message when set (see set_chunk_handler); the view points into the
  // receive buffer and is valid only during the call.
  using ChunkHandler = std::function<void(const wire::ChunkView&)>;

  // Starts reading. REQUIRES: called once.
  void start(MessageHandler on_message, CloseHandler on_close);
  // Optional: Chunk messages go here instead of to the message handler, without the copy of
  // their data that a v1::Envelope makes. Set it before start() or from a handler.
  void set_chunk_handler(ChunkHandler on_chunk) { on_chunk_ = std::move(on_chunk); }
  // Queues one envelope. FailedPrecondition once closing; ResourceExhausted when the queue is
  // full; InvalidArgument when the message exceeds the frame limit.
  Status send(const v1::Envelope& envelope);
  // Queues Envelope{chunk}, the same bytes as send() of that message, written straight from
  // the view (one copy into a reused buffer; the data need not outlive the call). Same errors.
  Status send_chunk(const wire::ChunkView& chunk);
  // Called whenever the send queue becomes empty.
  void set_drain_handler(std::function<void()> on_drain) { on_drain_ = std::move(on_drain); }
  // From now on a peer may stay silent for `idle` (Deadlines::idle) before it is taken for
  // gone, counted from this call: for a peer that is known to be busy for a while (a client
  // training its round on its I/O thread).
  void set_idle_deadline(Millis idle);
  // Sends what is queued (within the frame deadline), then closes TLS and the socket.
  void close();
  // Closes at once with `reason` (passed to the close handler).
  void abort(const Status& reason);

  const PeerIdentity& peer() const { return peer_; }
  size_t queued_bytes() const { return queued_bytes_; }
  // Bytes allocated for frames (the receive buffer and written frames kept for reuse); a
  // connection quiet for half a second gives them back, so this drops to 0.
  size_t buffer_bytes() const;
  bool is_open() const { return !closing_ && !closed_; }

  // Called after the socket is closed, before the close handler; used by Server to count.
  void set_teardown_hook(std::function<void()> hook) { teardown_hook_ = std::move(hook); }

 private:
  void do_read();
  void on_read(const asio::error_code& ec, size_t n);
  Status consume(size_t n);
  Status deliver(std::string_view frame);
  Status enqueue(std::string frame);
  std::string take_spare();
  void arm_read_deadline();
  void wait_read_deadline();
  void arm_trim();
  void on_trim();
  void do_write();
  void begin_shutdown();
  void fail(const Status& reason);
  void teardown(const Status& reason);

  std::unique_ptr<SslStream> stream_;
  PeerIdentity peer_;
  ConnectionOptions options_;
  wire::FrameDecoder decoder_;
  // Between frames reads land here, not in the decoder, so an idle connection can give back
  // its frame-sized buffers (see arm_trim): a server with many quiet clients stays small.
  std::array<char, 4096> idle_read_;
  bool reading_idle_ = false;  // the pending read is into idle_read_
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  asio::steady_timer trim_timer_;
  bool trim_armed_ = false;
  std::chrono::steady_clock::time_point last_read_{};   // last bytes received
  std::chrono::steady_clock::time_point last_write_{};  // last write completed
  bool frame_in_progress_ = false;
  std::chrono::steady_clock::time_point frame_deadline_{};
  std::chrono::steady_clock::time_point read_deadline_{};
  bool read_timer_armed_ = false;

  std::deque<std::string> queue_;
  // Written frames kept for reuse, so a stream of large frames allocates (and page-faults) once.
  std::vector<std::string> spare_;
  size_t queued_bytes_ = 0;
  size_t writing_count_ = 0;  // frames at the head of queue_ handed to async_write
  bool started_ = false;
  bool closing_ = false;  // close() called: no more sends, flush then shut down
  bool shutting_down_ = false;
  bool closed_ = false;
  Status close_status_;

  MessageHandler on_message_;
  ChunkHandler on_chunk_;
  CloseHandler on_close_;
  std::function<void()> on_drain_;
  std::function<void()> teardown_hook_;
};

}  // namespace starling::net
