// An update larger than memory budgets, moved over mutual TLS on loopback and folded the way the
// aggregator does it: the sender generates an update stream (identity and fp16 segments) a
// chunk at a time, the receiver spills it to disk while hashing it, then folds it from the
// spill file a window at a time into a sum file, and checks every element of the sum. Nothing
// model-sized is held in memory on either side. Used by tests/aggregator/large_update_test.cc
// and bench/update_stream_bench.cc. Header-only: link starling_aggregator and
// starling_edge_client.
#pragma once

#include <sys/resource.h>

#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "aggregator/stream_fold.h"
#include "aggregator/upload_spill.h"
#include "core/compress/update_stream.h"
#include "core/net/chunk_stream.h"
#include "core/net/server.h"
#include "edge_client/transfer.h"
#include "tests/testing/loopback.h"

namespace starling::testing {

// Element i of the generated update: small multiples of 1/4, exact in f32 and fp16, so the
// folded sum can be checked exactly.
inline float large_update_value(int64_t i) { return static_cast<float>(i % 1021 - 510) * 0.25f; }

// fp16 bits of large_update_value (normal halves or zero: exact).
inline uint16_t large_update_half(int64_t i) {
  const int64_t q = i % 1021 - 510;  // value = q / 4
  if (q == 0) return 0;
  const uint16_t sign = q < 0 ? 0x8000 : 0;
  uint32_t m = static_cast<uint32_t>(q < 0 ? -q : q);
  int e = 31 - __builtin_clz(m);  // m = 2^e * (1 + f)
  const uint32_t frac = (m << (10 - e)) & 0x3ff;
  return static_cast<uint16_t>(sign | ((e - 2 + 15) << 10) | frac);
}

// A generated update stream of `numel` elements: identity segments of `segment` elements, the
// last quarter of the elements in one fp16 segment.
class GeneratedUpdate : public net::PayloadSource {
 public:
  GeneratedUpdate(int64_t numel, int64_t segment) {
    compress::EncodedUpdate meta;
    meta.numel = numel;
    const int64_t half_from = numel - numel / 4;
    std::vector<compress::ArrayBytes> bytes;
    for (int64_t at = 0; at < numel;) {
      compress::Segment s;
      s.offset = at;
      s.codec = at < half_from ? compress::CodecKind::kIdentity : compress::CodecKind::kFp16;
      s.numel = at < half_from ? std::min(segment, half_from - at) : numel - at;
      s.shape = {s.numel};
      compress::ArrayBytes b{};
      b[s.codec == compress::CodecKind::kIdentity ? compress::kArrF32 : compress::kArrU16] =
          static_cast<uint64_t>(s.numel) * (s.codec == compress::CodecKind::kIdentity ? 4 : 2);
      bytes.push_back(b);
      at += s.numel;
      meta.segments.push_back(std::move(s));
    }
    header_ = compress::update_stream_header(meta, bytes);
    half_from_ = half_from;
    f32_end_ = header_.size() + static_cast<uint64_t>(half_from) * 4;
    size_ = f32_end_ + static_cast<uint64_t>(numel - half_from) * 2;
  }
  uint64_t size() const override { return size_; }
  Status read(uint64_t offset, std::span<char> out) const override {
    if (offset > size_ || out.size() > size_ - offset) return out_of_range("past the end");
    for (size_t done = 0; done < out.size();) {
      const uint64_t at = offset + done;
      if (at < header_.size()) {
        const size_t n = std::min<size_t>(header_.size() - at, out.size() - done);
        std::memcpy(out.data() + done, header_.data() + at, n);
        done += n;
        continue;
      }
      // Whole elements where aligned, byte by byte at a ragged edge.
      const bool f32 = at < f32_end_;
      const uint64_t base = f32 ? header_.size() : f32_end_;
      const uint64_t width = f32 ? 4 : 2;
      const uint64_t rel = at - base;
      const int64_t first = static_cast<int64_t>(rel / width) + (f32 ? 0 : half_from_);
      const uint64_t region_end = f32 ? f32_end_ : size_;
      const uint64_t stop = std::min<uint64_t>(region_end, offset + out.size());
      int64_t e = first;
      uint64_t pos = at;
      while (pos < stop) {
        char elem[4];
        if (f32) {
          const float v = large_update_value(e);
          std::memcpy(elem, &v, 4);
        } else {
          const uint16_t h = large_update_half(e);
          std::memcpy(elem, &h, 2);
        }
        const uint64_t within = (pos - base) % width;
        const size_t n = static_cast<size_t>(std::min<uint64_t>(width - within, stop - pos));
        std::memcpy(out.data() + (pos - offset), elem + within, n);
        pos += n;
        ++e;
      }
      done = static_cast<size_t>(pos - offset);
    }
    return ok_status();
  }

 private:
  std::string header_;
  int64_t half_from_ = 0;
  uint64_t f32_end_ = 0;
  uint64_t size_ = 0;
};

inline uint64_t process_peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

struct LargeUpdateRun {
  Status status;
  uint64_t payload_bytes = 0;
  double transfer_seconds = 0;  // first chunk sent to SHA-256 verified on the receiver
  double fold_seconds = 0;      // both passes of the fold, from the spill file into the sum file
  double check_seconds = 0;
  uint64_t mismatches = 0;      // elements of the sum != weight * value
  uint64_t peak_rss_bytes = 0;  // of the whole process: sender and receiver together
};

// Moves a generated update of `numel` elements from a client to a server over TLS on loopback,
// spills and folds it with weight 2 into a FileSum under `dir`, and checks the sum.
inline LargeUpdateRun run_large_update(const net::TlsConfig& server_tls,
                                       const net::TlsConfig& client_tls, int64_t numel,
                                       const std::filesystem::path& dir,
                                       std::chrono::seconds deadline = std::chrono::seconds(1800),
                                       uint32_t chunk_bytes = 1u << 20) {
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + deadline;
  std::atomic<bool> timed_out{false};
  LargeUpdateRun run;
  auto source = std::make_shared<GeneratedUpdate>(numel, int64_t{1} << 28);
  run.payload_bytes = source->size();
  constexpr float kWeight = 2.0f;

  // The receiver, on its own thread and io_context.
  asio::io_context server_io;
  auto sctx = net::make_tls_context(server_tls, net::TlsSide::kServer);
  if (!sctx.ok()) return {sctx.status()};
  std::atomic<bool> received{false};
  std::atomic<bool> failed{false};
  Status server_status;
  std::optional<net::ChunkReceiver> rx;
  std::unique_ptr<aggregator::SpillFile> spill;
  Clock::time_point transfer_start{}, transfer_end{};
  std::shared_ptr<net::Connection> server_conn;
  auto fail = [&](Status st) {
    server_status = std::move(st);
    failed = true;
  };
  auto server = net::Server::listen(
      server_io, *sctx, {},
      [&](std::shared_ptr<net::Connection> c) {
        server_conn = c;
        c->set_chunk_handler([&](const wire::ChunkView& chunk) {
          if (!rx) return fail(invalid_argument("chunk before the header"));
          if (chunk.index == 0) transfer_start = Clock::now();
          if (Status st = rx->accept(chunk); !st.ok()) return fail(st);
          if (!rx->all_received()) return;
          if (Status st = rx->finish(); !st.ok()) return fail(st);
          transfer_end = Clock::now();
          received = true;
        });
        c->start(
            [&](v1::Envelope e) {
              if (!e.has_update_upload()) return;
              auto file = aggregator::SpillFile::create(dir);
              if (!file.ok()) return fail(file.status());
              spill = std::move(*file);
              auto r = net::ChunkReceiver::create(
                  e.update_upload().transfer(), uint64_t{1} << 40,
                  [f = spill.get()](uint64_t offset, std::string_view data) {
                    return f->write(offset, data);
                  },
                  net::ChunkReceiver::Hashing::kBackground);
              if (!r.ok()) return fail(r.status());
              rx.emplace(std::move(*r));
            },
            [](const Status&) {});
      },
      [](const Status&) {});
  if (!server.ok()) return {server.status()};
  const uint16_t port = (*server)->port();
  std::thread server_thread([&] {
    while (!received && !failed && !timed_out) server_io.run_for(std::chrono::milliseconds(20));
  });

  // The sender: an update stream generated a chunk at a time, through the client's pump.
  asio::io_context client_io;
  auto conn = connect_client(client_io, client_tls, port);
  if (!conn.ok()) {
    failed = true;
    server_thread.join();
    return {conn.status()};
  }
  (*conn)->start([](v1::Envelope) {}, [](const Status&) {});
  auto pump = std::make_shared<edge_client::ChunkPump>(
      *conn, source, 1, chunk_bytes, std::string(edge_client::kUpdateStreamContentType));
  v1::Envelope head;
  auto* up = head.mutable_update_upload();
  up->set_round(1);
  up->set_num_samples(1);
  *up->mutable_transfer() = pump->header();
  if (Status st = (*conn)->send(head); !st.ok()) {
    failed = true;
    server_thread.join();
    return {st};
  }
  pump->start();
  while (!received && !failed) {
    if (Clock::now() > give_up) {
      timed_out = true;
      break;
    }
    client_io.run_for(std::chrono::milliseconds(20));
  }
  server_thread.join();
  pump->cancel();
  (*conn)->close();
  if (failed) return {server_status};
  if (timed_out) {
    return {deadline_exceeded("the transfer of " + std::to_string(run.payload_bytes) +
                              " bytes did not finish within " + std::to_string(deadline.count()) +
                              " s")};
  }
  run.transfer_seconds = std::chrono::duration<double>(transfer_end - transfer_start).count();

  // The fold, from the spill file into a sum on disk.
  auto sum = aggregator::FileSum::create(dir / "sum.f32", numel);
  if (!sum.ok()) return {sum.status()};
  const auto fold_start = Clock::now();
  auto folded = aggregator::fold_update_stream(
      [f = spill.get()](uint64_t offset, std::span<char> out) { return f->read_at(offset, out); },
      run.payload_bytes, **sum, kWeight);
  run.fold_seconds = std::chrono::duration<double>(Clock::now() - fold_start).count();
  if (!folded.ok()) return {folded.status()};
  spill.reset();

  const auto check_start = Clock::now();
  std::vector<float> window(1 << 22);
  for (int64_t at = 0; at < numel; at += static_cast<int64_t>(window.size())) {
    const auto n = static_cast<size_t>(std::min<int64_t>(numel - at, window.size()));
    if (Status st = (*sum)->read(at, std::span<float>(window.data(), n)); !st.ok()) return {st};
    for (size_t j = 0; j < n; ++j) {
      if (window[j] != kWeight * large_update_value(at + static_cast<int64_t>(j))) ++run.mismatches;
    }
  }
  run.check_seconds = std::chrono::duration<double>(Clock::now() - check_start).count();
  sum->reset();
  std::filesystem::remove(dir / "sum.f32");
  run.peak_rss_bytes = process_peak_rss_bytes();
  return run;
}

}  // namespace starling::testing
