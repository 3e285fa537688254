// TlsStream: the socket BIO and the mapping of OpenSSL's errors to asio's.
#include "core/net/tls_stream.h"

#include <openssl/bio.h>
#include <sys/socket.h>

#include <cstdint>

namespace starling::net {
namespace {

int fd_of(BIO* b) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b))); }

bool would_block(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }

// recv/send on the socket: MSG_NOSIGNAL, so a peer's reset is an error rather than SIGPIPE;
// would-block sets the retry flag that turns into SSL_ERROR_WANT_READ / _WRITE.
int socket_read(BIO* b, char* out, size_t n, size_t* got) {
  BIO_clear_retry_flags(b);
  const ssize_t r = ::recv(fd_of(b), out, n, 0);
  if (r > 0) {
    *got = static_cast<size_t>(r);
    return 1;
  }
  *got = 0;
  if (r < 0 && would_block(errno)) BIO_set_retry_read(b);
  if (r == 0) errno = 0;  // end of stream, not an error of the socket
  return 0;
}

int socket_write(BIO* b, const char* in, size_t n, size_t* put) {
  BIO_clear_retry_flags(b);
  const ssize_t r = ::send(fd_of(b), in, n, MSG_NOSIGNAL);
  if (r >= 0) {
    *put = static_cast<size_t>(r);
    return 1;
  }
  *put = 0;
  if (would_block(errno)) BIO_set_retry_write(b);
  return 0;
}

long socket_ctrl(BIO*, int cmd, long, void*) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;  // nothing is buffered here
}

int socket_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* socket_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "starling socket");
    if (m == nullptr) return m;
    BIO_meth_set_read_ex(m, socket_read);
    BIO_meth_set_write_ex(m, socket_write);
    BIO_meth_set_ctrl(m, socket_ctrl);
    BIO_meth_set_create(m, socket_create);
    return m;
  }();
  return method;
}

}  // namespace

TlsStream::TlsStream(asio::io_context& io, asio::ssl::context& ctx)
    : socket_(io), ssl_(SSL_new(ctx.native_handle())) {}

TlsStream::TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& ctx)
    : socket_(std::move(socket)), ssl_(SSL_new(ctx.native_handle())) {}

TlsStream::~TlsStream() {
  // The socket closes itself; the BIO only borrows its descriptor.
  if (ssl_ != nullptr) SSL_free(ssl_);
}

asio::error_code TlsStream::attach(asio::ssl::stream_base::handshake_type type) {
  if (ssl_ == nullptr) return asio::error::no_memory;
  if (!socket_.is_open()) return asio::error::bad_descriptor;
  asio::error_code ec;
  socket_.non_blocking(true, ec);
  if (ec) return ec;
  const BIO_METHOD* method = socket_method();
  BIO* bio = method != nullptr ? BIO_new(method) : nullptr;
  if (bio == nullptr) return asio::error::no_memory;
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(socket_.native_handle())));
  SSL_set_bio(ssl_, bio, bio);  // ssl_ owns the BIO now
  if (type == asio::ssl::stream_base::client) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
  return {};
}

int TlsStream::read_available(char* data, int n) {
  int total = 0;
  while (total < n) {
    const int r = SSL_read(ssl_, data + total, n - total);
    if (r > 0) {
      total += r;
      read_in_hand_ = true;
      continue;
    }
    if (total == 0) return r;  // run() looks at the error (or waits for the socket)
    const int saved_errno = errno;
    const int err = SSL_get_error(ssl_, r);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      read_error_ = error_for(err, saved_errno);
    }
    ERR_clear_error();
    break;
  }
  return total;
}

asio::error_code TlsStream::error_for(int ssl_error, int saved_errno) {
  switch (ssl_error) {
    case SSL_ERROR_ZERO_RETURN:
      return asio::error::eof;  // the peer's close_notify
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        if (saved_errno != 0) return {saved_errno, asio::error::get_system_category()};
        return asio::ssl::error::stream_truncated;  // TCP closed without close_notify
      }
      [[fallthrough]];
    case SSL_ERROR_SSL: {
      const unsigned long e = ERR_get_error();
      ERR_clear_error();
      if (ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        return asio::ssl::error::stream_truncated;
      }
      return {static_cast<int>(e), asio::error::get_ssl_category()};
    }
    default:
      return {ssl_error, asio::error::get_ssl_category()};
  }
}

}  // namespace starling::net
