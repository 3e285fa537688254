// Pieces of the federation protocol shared by the aggregator and the edge client: the raw f32
// model payload, a chunk pump that respects a connection's send queue, and the end-of-run Error.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/compress/update_stream.h"
#include "core/net/chunk_stream.h"
#include "core/net/connection.h"
#include "core/util/status.h"

namespace starling::edge_client {

// Content type of a model download: the flat parameter vector as little-endian f32.
inline constexpr std::string_view kModelContentType = "f32";
// Content type of an update: a serialized starling.v1.EncodedUpdate (core/compress), at most
// 2 GiB; the aggregator still takes it from older clients.
inline constexpr std::string_view kUpdateContentType = "encoded_update";
// Content type of an update of any size: an update stream (core/compress/update_stream.h),
// what clients send.
inline constexpr std::string_view kUpdateStreamContentType = "update_stream";
// Error.message of the non-retryable Error the aggregator sends when the run is complete;
// clients stop instead of reconnecting.
// A secure aggregation round's masked vector: a serialized v1::SecAggMaskedInput, which the
// aggregator adds to its running sum of masked vectors (docs/secagg.md).
inline constexpr std::string_view kSecAggMaskedContentType = "secagg/masked";
// The client state's entry (ClientState::codec_state) for the secure aggregation residual.
inline constexpr std::string_view kSecAggStateKey = "secagg";
inline constexpr std::string_view kFederationComplete = "federation complete";

// Flat f32 vector <-> little-endian bytes. from_f32_bytes: DataLoss unless the payload holds
// exactly `numel` floats.
std::string to_f32_bytes(std::span<const float> values);
Status from_f32_bytes(std::string_view bytes, std::span<float> out);

// Sends the chunks of one transfer on a connection, as fast as its send queue allows: when the
// queue holds more than `high_water` bytes it waits for the connection's drain handler.
// The pump owns the payload. Not thread-safe (io_context thread only). At most one pump per
// connection, since it takes over the drain handler; cancel() an old one before starting another.
class ChunkPump;

// Shares a number of concurrent transfers among pumps: a server sending the model to a
// thousand clients fills at most `slots` send queues at a time (memory: slots x high water),
// and the other pumps wait their turn in arrival order. Same thread rules as ChunkPump.
class PumpSlots {
 public:
  explicit PumpSlots(size_t slots) : free_(slots > 0 ? slots : 1) {}
  size_t free_slots() const { return free_; }
  size_t waiting() const { return waiting_.size(); }

 private:
  friend class ChunkPump;
  void enqueue(const std::shared_ptr<ChunkPump>& pump);
  void release();
  void start_waiting();

  size_t free_;
  std::deque<std::weak_ptr<ChunkPump>> waiting_;
};

// A payload the source owns: a string, or an encoded update read out as an update stream
// (core/compress/update_stream.h) without a serialized copy.
class StringSource : public net::PayloadSource {
 public:
  explicit StringSource(std::shared_ptr<const std::string> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_->size(); }
  Status read(uint64_t offset, std::span<char> out) const override {
    return net::MemorySource(*bytes_).read(offset, out);
  }
  std::optional<std::string_view> contiguous() const override { return *bytes_; }

 private:
  std::shared_ptr<const std::string> bytes_;
};

class UpdateStreamSource : public net::PayloadSource {
 public:
  explicit UpdateStreamSource(std::shared_ptr<const compress::EncodedUpdate> update)
      : update_(std::move(update)), writer_(*update_) {}
  uint64_t size() const override { return writer_.size(); }
  Status read(uint64_t offset, std::span<char> out) const override {
    if (offset > size() || out.size() > size() - offset) {
      return out_of_range("read past the end of an update stream");
    }
    writer_.read(offset, out);
    return ok_status();
  }

 private:
  std::shared_ptr<const compress::EncodedUpdate> update_;
  compress::UpdateStreamWriter writer_;
};

class ChunkPump : public std::enable_shared_from_this<ChunkPump> {
 public:
  ChunkPump(std::shared_ptr<net::Connection> conn, std::shared_ptr<const std::string> payload,
            uint64_t transfer_id, uint32_t chunk_bytes, std::string content_type,
            size_t high_water = 8u << 20);
  ChunkPump(std::shared_ptr<net::Connection> conn, std::shared_ptr<const net::PayloadSource> source,
            uint64_t transfer_id, uint32_t chunk_bytes, std::string content_type,
            size_t high_water = 8u << 20);
  ~ChunkPump();
  ChunkPump(const ChunkPump&) = delete;
  ChunkPump& operator=(const ChunkPump&) = delete;
  // Takes turns with the other pumps of `slots`: start() then waits for a free slot, and the
  // slot is given back once every chunk is written (or on cancel). Call before start().
  void set_slots(std::shared_ptr<PumpSlots> slots) { slots_ = std::move(slots); }
  const v1::TransferHeader& header() const { return sender_.header(); }
  // Starts sending chunk 0 onward (call after the message carrying header() was sent).
  void start();
  // Resends from `index` (a ChunkAck from the receiver asked for it).
  void resume_from(uint64_t index);
  void cancel();
  bool done() const { return next_ >= sender_.num_chunks(); }
  bool started() const { return started_flag_; }
  // Paces the chunks to at most `bytes_per_second` of payload (0: as fast as the connection
  // takes them), e.g. an edge device's upload cap. Call before start().
  void set_rate_limit(asio::any_io_executor executor, uint64_t bytes_per_second);
  // Called with each chunk's index once the connection has queued it.
  void set_on_chunk_sent(std::function<void(uint64_t index)> hook) { on_sent_ = std::move(hook); }

 private:
  friend class PumpSlots;
  void begin();  // start() once a slot is held (or without slots)
  void release_slot();
  void pump();

  std::shared_ptr<PumpSlots> slots_;
  bool holds_slot_ = false;
  bool started_flag_ = false;
  std::weak_ptr<net::Connection> conn_;
  net::ChunkSender sender_;
  std::string scratch_;  // the chunk being framed, for sources not in memory
  std::function<void(uint64_t)> on_sent_;
  size_t high_water_;
  uint64_t next_ = 0;
  bool cancelled_ = false;
  // Rate limit: payload bytes may leave no earlier than started_ + sent_ / rate_.
  uint64_t rate_ = 0;
  uint64_t sent_ = 0;
  std::chrono::steady_clock::time_point started_;
  std::unique_ptr<asio::steady_timer> timer_;
  bool timer_armed_ = false;
};

}  // namespace starling::edge_client
