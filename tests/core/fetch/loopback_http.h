// A minimal HTTP/1.1 server for download tests: a thread on 127.0.0.1 port 0 serving bodies from
// memory, one connection at a time. Routes can fail on purpose (status codes, a body cut short,
// a stalled body). The thread wakes only on sockets or a stop pipe, and gives up at a deadline.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace starling::testing {

struct HttpRoute {
  HttpRoute(int status_code, std::string body_bytes)
      : status(status_code), body(std::move(body_bytes)) {}

  int status = 200;
  std::string body;
  // Announce the whole body in Content-Length but send only this many bytes, then close.
  std::optional<size_t> cut_after;
  // Send the headers, then nothing until the server stops.
  bool stall = false;
};

class LoopbackHttpServer {
 public:
  explicit LoopbackHttpServer(std::map<std::string, HttpRoute> routes,
                              std::chrono::milliseconds deadline = std::chrono::seconds(20))
      : routes_(std::move(routes)), end_(std::chrono::steady_clock::now() + deadline) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        ::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
      throw std::runtime_error("loopback http server: socket setup failed");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }

  LoopbackHttpServer(const LoopbackHttpServer&) = delete;
  LoopbackHttpServer& operator=(const LoopbackHttpServer&) = delete;

  ~LoopbackHttpServer() {
    const char b = 'x';
    (void)!::write(stop_pipe_[1], &b, 1);
    thread_.join();
    ::close(listen_fd_);
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }

  uint16_t port() const { return port_; }
  std::string url(std::string_view path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + std::string(path);
  }
  // How many requests for `path` arrived so far.
  int requests(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = counts_.find(path);
    return it == counts_.end() ? 0 : it->second;
  }
  // True once the deadline passed while the server was still running (a test bug or a hang).
  bool timed_out() const { return timed_out_.load(); }

 private:
  // Waits until fd is readable or the server stops; false on stop or deadline.
  bool wait_readable(int fd) {
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end_ - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out_ = true;
        return false;
      }
      pollfd fds[2] = {{fd, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
      const int n = ::poll(fds, 2, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (fds[1].revents & POLLIN)) return false;
      if (fds[0].revents != 0) return true;
    }
  }

  void send_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  void serve() {
    while (wait_readable(listen_fd_)) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const bool keep_going = handle(fd);
      ::close(fd);
      if (!keep_going) return;
    }
  }

  // Serves one request; false when the server should stop.
  bool handle(int fd) {
    std::string request;
    while (request.find("\r\n\r\n") == std::string::npos) {
      if (!wait_readable(fd)) return false;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return true;
      request.append(buf, static_cast<size_t>(n));
    }
    // "GET /path HTTP/1.1"
    const size_t sp1 = request.find(' ');
    const size_t sp2 = request.find(' ', sp1 + 1);
    const std::string path = request.substr(sp1 + 1, sp2 - sp1 - 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++counts_[path];
    }
    const auto it = routes_.find(path);
    HttpRoute route = it != routes_.end() ? it->second : HttpRoute{404, "no such file\n"};
    const std::string reason = route.status == 200 ? "OK" : "Error";
    send_all(fd, "HTTP/1.1 " + std::to_string(route.status) + " " + reason +
                     "\r\nContent-Length: " + std::to_string(route.body.size()) +
                     "\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n");
    if (route.stall) {
      wait_readable(stop_pipe_[0]);  // returns on stop or deadline
      return false;
    }
    std::string_view body = route.body;
    if (route.cut_after) body = body.substr(0, *route.cut_after);
    send_all(fd, body);
    return true;
  }

  std::map<std::string, HttpRoute> routes_;
  std::chrono::steady_clock::time_point end_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  uint16_t port_ = 0;
  mutable std::mutex mu_;
  std::map<std::string, int> counts_;
  std::atomic<bool> timed_out_{false};
  std::thread thread_;
};

}  // namespace starling::testing
