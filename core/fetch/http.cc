// libcurl easy interface, one handle per call; curl's error codes become a Status here, once.
#include "core/fetch/http.h"

#include <curl/curl.h>

#include <memory>
#include <mutex>

namespace starling::fetch {
namespace {

struct CurlFree {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  const BodySink* sink = nullptr;
  int64_t max_bytes = 0;
  int64_t received = 0;
  Status sink_status;  // why the write callback aborted, if it did
};

size_t on_body(char* data, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * nmemb;
  t->received += static_cast<int64_t>(n);
  if (t->received > t->max_bytes) {
    t->sink_status = resource_exhausted("body larger than the limit of " +
                                        std::to_string(t->max_bytes) + " bytes");
    return 0;  // anything but n aborts the transfer
  }
  Status st = (*t->sink)(std::string_view(data, n));
  if (!st.ok()) {
    t->sink_status = std::move(st);
    return 0;  // anything but n aborts the transfer
  }
  return n;
}

bool has_http_scheme(std::string_view url) {
  return url.starts_with("http://") || url.starts_with("https://");
}

}  // namespace

Status http_get(const std::string& url, const HttpOptions& options, const BodySink& sink) {
  const std::string where = "GET " + url;
  if (!has_http_scheme(url)) {
    return invalid_argument(where + ": only http:// and https:// URLs are supported");
  }
  init_curl_once();
  std::unique_ptr<CURL, CurlFree> curl(curl_easy_init());
  if (!curl) return internal_error(where + ": curl_easy_init failed");
  CURL* c = curl.get();
  Transfer t;
  t.sink = &sink;
  t.max_bytes = options.max_bytes;
  char errbuf[CURL_ERROR_SIZE] = {};

  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, static_cast<long>(options.max_redirects));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM; safe in threads
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options.low_speed_bytes));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options.low_speed_time.count()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options.total_timeout.count()));
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, options.verify_tls ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, options.verify_tls ? 2L : 0L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);  // HTTP >= 400: no body, an error instead
  curl_easy_setopt(c, CURLOPT_USERAGENT, "starling/0.1");
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);

  const CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK) return ok_status();
  if (!t.sink_status.ok()) return t.sink_status.with_context(where);

  const std::string detail = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
  switch (rc) {
    case CURLE_HTTP_RETURNED_ERROR: {
      long code = 0;
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
      const std::string msg = where + ": HTTP " + std::to_string(code);
      return code == 404 ? not_found(msg + " (not found)") : unavailable(msg);
    }
    case CURLE_OPERATION_TIMEDOUT:
      return deadline_exceeded(where + ": timed out: " + detail);
    case CURLE_PARTIAL_FILE:
      return unavailable(where + ": connection closed before the whole body arrived (" +
                         std::to_string(t.received) + " bytes received): " + detail);
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return invalid_argument(where + ": " + detail);
    case CURLE_FILESIZE_EXCEEDED:
      return resource_exhausted(where + ": " + detail);
    default:
      return unavailable(where + ": " + detail);
  }
}

}  // namespace starling::fetch
