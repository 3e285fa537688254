// TlsStream: TLS 1.3 over a non-blocking TCP socket, with OpenSSL reading and writing the
// socket itself through a minimal BIO (recv/send). It has the subset of asio::ssl::stream's
// interface the transport uses, without asio's per-stream buffers: asio::ssl::stream keeps two
// 17 KiB vectors and a 2 x 17 KiB BIO pair per connection (about 68 KiB, touched as soon as
// data flows) and copies every record through them. Here an idle connection costs its SSL
// object (OpenSSL frees record buffers between records, SSL_MODE_RELEASE_BUFFERS), and
// ciphertext goes straight between the socket and OpenSSL.
//
// Every operation first calls OpenSSL; only when OpenSSL reports that the socket would block
// does it wait (socket::async_wait) and retry. Waiting only after EAGAIN is what asio's
// edge-triggered reactor needs: readiness that arrives later produces a new event. That holds
// when one thread runs the io_context (as everywhere in starling): with several, another
// thread could take the readiness event between OpenSSL's EAGAIN and the wait being queued.
// Handlers never run inside the initiating call (completions are posted). Not thread-safe: a
// read and a write may be in flight at once (OpenSSL allows interleaving them on one thread).
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <asio/buffer.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream_base.hpp>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <utility>

namespace starling::net {

class TlsStream {
 public:
  using executor_type = asio::ip::tcp::socket::executor_type;
  using lowest_layer_type = asio::ip::tcp::socket;

  // A client stream: connect lowest_layer(), then async_handshake(client).
  TlsStream(asio::io_context& io, asio::ssl::context& ctx);
  // A server stream over an accepted socket.
  TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& ctx);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  executor_type get_executor() { return socket_.get_executor(); }
  lowest_layer_type& lowest_layer() { return socket_; }
  lowest_layer_type& next_layer() { return socket_; }
  SSL* native_handle() { return ssl_; }

  // handler(const asio::error_code&)
  template <typename Handler>
  void async_handshake(asio::ssl::stream_base::handshake_type type, Handler&& handler) {
    const asio::error_code attached = attach(type);
    if (attached) return post_done(std::forward<Handler>(handler), attached);
    run([ssl = ssl_] { return SSL_do_handshake(ssl); },
        [h = std::forward<Handler>(handler)](const asio::error_code& ec, size_t) mutable {
          h(ec);
        });
  }

  // handler(const asio::error_code&, size_t): reads the records that have arrived, up to the
  // buffer's size (at least one byte: it waits for the first record). EOF after the peer's
  // close_notify is asio::error::eof; a close without it is asio::ssl::error::stream_truncated.
  // An error met after some bytes were read is reported by the next read.
  template <typename MutableBufferSequence, typename Handler>
  void async_read_some(const MutableBufferSequence& buffers, Handler&& handler) {
    const asio::mutable_buffer b =
        first_buffer(asio::buffer_sequence_begin(buffers), asio::buffer_sequence_end(buffers));
    if (b.size() == 0) return post_done(std::forward<Handler>(handler), asio::error_code(), 0);
    if (read_error_) {
      return post_done(std::forward<Handler>(handler), std::exchange(read_error_, {}), 0);
    }
    run([this, data = static_cast<char*>(b.data()),
         n = clamp(b.size())] { return read_available(data, n); },
        [this, h = std::forward<Handler>(handler)](const asio::error_code& ec, size_t n) mutable {
          read_in_hand_ = false;
          h(ec, n);
        });
  }

  // True while bytes have been read from the socket that the reader has not been handed yet
  // (its completion is queued, or OpenSSL holds decrypted bytes): the peer has spoken even if
  // the socket is empty, which an idle deadline must not mistake for silence.
  bool read_in_hand() const { return read_in_hand_ || SSL_pending(ssl_) > 0; }

  // handler(const asio::error_code&, size_t): writes the first non-empty buffer whole (so
  // asio::async_write works over this stream, one SSL_write per buffer).
  template <typename ConstBufferSequence, typename Handler>
  void async_write_some(const ConstBufferSequence& buffers, Handler&& handler) {
    const asio::const_buffer b =
        first_buffer(asio::buffer_sequence_begin(buffers), asio::buffer_sequence_end(buffers));
    if (b.size() == 0) return post_done(std::forward<Handler>(handler), asio::error_code(), 0);
    run([ssl = ssl_, data = b.data(), n = clamp(b.size())] { return SSL_write(ssl, data, n); },
        std::forward<Handler>(handler));
  }

  // handler(const asio::error_code&): sends close_notify and waits for the peer's.
  template <typename Handler>
  void async_shutdown(Handler&& handler) {
    run(
        [ssl = ssl_] {
          int r = SSL_shutdown(ssl);
          if (r == 0) r = SSL_shutdown(ssl);  // ours is sent: now read the peer's
          return r;
        },
        [h = std::forward<Handler>(handler)](const asio::error_code& ec, size_t) mutable {
          h(ec);
        });
  }

 private:
  // Gives OpenSSL the (connected) socket, made non-blocking, and the side of the handshake.
  asio::error_code attach(asio::ssl::stream_base::handshake_type type);
  // What a failed OpenSSL call stands for: its SSL_get_error() code, errno right after it.
  static asio::error_code error_for(int ssl_error, int saved_errno);
  // SSL_read until `n` bytes or until OpenSSL would wait for the socket: one completion per
  // burst of records, not per 16 KiB record. Returns what SSL_read would for the first record;
  // after some bytes, a failure is kept in read_error_ and the bytes are returned.
  int read_available(char* data, int n);

  static int clamp(size_t n) { return n > INT_MAX ? INT_MAX : static_cast<int>(n); }

  template <typename Iterator>
  static auto first_buffer(Iterator begin, Iterator end) {
    using Buffer = std::decay_t<decltype(*begin)>;
    for (Iterator it = begin; it != end; ++it) {
      Buffer b(*it);
      if (b.size() != 0) return b;
    }
    return Buffer();
  }

  template <typename Handler, typename... Args>
  void post_done(Handler&& handler, Args... args) {
    asio::post(socket_.get_executor(),
               [h = std::forward<Handler>(handler), args...]() mutable { h(args...); });
  }

  // Calls op (an SSL function: > 0 is success) until it succeeds or fails; done(ec, n).
  template <typename Op, typename Done>
  void run(Op op, Done&& done) {
    ERR_clear_error();
    errno = 0;
    const int r = op();
    const int saved_errno = errno;
    if (r > 0) return post_done(std::forward<Done>(done), asio::error_code(), size_t(r));
    const int err = SSL_get_error(ssl_, r);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      socket_.async_wait(
          err == SSL_ERROR_WANT_READ ? asio::socket_base::wait_read : asio::socket_base::wait_write,
          [this, op = std::move(op),
           d = std::forward<Done>(done)](const asio::error_code& ec) mutable {
            if (ec) return d(ec, size_t{0});
            run(std::move(op), std::move(d));
          });
      return;
    }
    post_done(std::forward<Done>(done), error_for(err, saved_errno), size_t{0});
  }

  asio::ip::tcp::socket socket_;
  SSL* ssl_ = nullptr;
  asio::error_code read_error_;  // met by read_available() after it had read some bytes
  bool read_in_hand_ = false;    // a read's bytes wait in its queued completion
};

}  // namespace starling::net
