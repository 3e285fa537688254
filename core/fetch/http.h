// HTTP(S) GET through libcurl, streamed to a caller's sink, with time and size limits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace starling::fetch {

struct HttpOptions {
  // Limit on establishing the connection (TCP and TLS).
  std::chrono::milliseconds connect_timeout{30'000};
  // The transfer is aborted when it stays below low_speed_bytes per second for low_speed_time.
  int64_t low_speed_bytes = 1024;
  std::chrono::seconds low_speed_time{60};
  // Limit on the whole transfer; zero for none (large files on slow links still finish).
  std::chrono::milliseconds total_timeout{0};
  // Bodies larger than this are refused (a peer cannot fill the disk).
  int64_t max_bytes = int64_t{1} << 30;
  // Verify the server's certificate and name. Only a test pointing at a throwaway server
  // would turn this off.
  bool verify_tls = true;
  int max_redirects = 5;
};

// Receives the body in chunks; a non-OK status aborts the transfer and is returned by http_get.
using BodySink = std::function<Status(std::string_view chunk)>;

// GETs `url` (http:// or https:// only; redirects followed within those schemes), passing the
// body to `sink`. Errors, each naming the URL: InvalidArgument (bad URL or scheme), NotFound
// (HTTP 404), Unavailable (other HTTP errors, connection failure, body cut short),
// DeadlineExceeded (a time limit), ResourceExhausted (max_bytes), or the sink's status.
// Thread-safe: each call uses its own handle.
Status http_get(const std::string& url, const HttpOptions& options, const BodySink& sink);

}  // namespace starling::fetch
