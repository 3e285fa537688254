// Raw f32 payloads and the chunk pump.
#include "edge_client/transfer.h"

#include <bit>
#include <cstring>

namespace starling::edge_client {

static_assert(std::endian::native == std::endian::little, "f32 payloads assume little-endian");

std::string to_f32_bytes(std::span<const float> values) {
  std::string out(values.size_bytes(), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), values.size_bytes());
  return out;
}

Status from_f32_bytes(std::string_view bytes, std::span<float> out) {
  if (bytes.size() != out.size_bytes()) {
    return data_loss("model payload of " + std::to_string(bytes.size()) + " bytes, expected " +
                     std::to_string(out.size_bytes()) + " (" + std::to_string(out.size()) +
                     " f32)");
  }
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return ok_status();
}

ChunkPump::ChunkPump(std::shared_ptr<net::Connection> conn,
                     std::shared_ptr<const std::string> payload, uint64_t transfer_id,
                     uint32_t chunk_bytes, std::string content_type, size_t high_water)
    : ChunkPump(std::move(conn), std::make_shared<StringSource>(std::move(payload)), transfer_id,
                chunk_bytes, std::move(content_type), high_water) {}

ChunkPump::ChunkPump(std::shared_ptr<net::Connection> conn,
                     std::shared_ptr<const net::PayloadSource> source, uint64_t transfer_id,
                     uint32_t chunk_bytes, std::string content_type, size_t high_water)
    : conn_(conn),
      sender_(transfer_id, std::move(source), chunk_bytes, std::move(content_type)),
      high_water_(high_water) {}

void ChunkPump::set_rate_limit(asio::any_io_executor executor, uint64_t bytes_per_second) {
  rate_ = bytes_per_second;
  if (rate_ > 0) timer_ = std::make_unique<asio::steady_timer>(executor);
}

void PumpSlots::enqueue(const std::shared_ptr<ChunkPump>& pump) {
  waiting_.push_back(pump);
  start_waiting();
}

void PumpSlots::release() {
  ++free_;
  start_waiting();
}

void PumpSlots::start_waiting() {
  while (free_ > 0 && !waiting_.empty()) {
    auto pump = waiting_.front().lock();
    waiting_.pop_front();
    if (!pump || pump->cancelled_) continue;
    --free_;
    pump->holds_slot_ = true;
    pump->begin();
  }
}

ChunkPump::~ChunkPump() {
  if (holds_slot_) slots_->release();
}

void ChunkPump::release_slot() {
  if (!holds_slot_) return;
  holds_slot_ = false;
  slots_->release();
}

void ChunkPump::start() {
  started_flag_ = true;
  if (slots_) return slots_->enqueue(shared_from_this());
  begin();
}

void ChunkPump::begin() {
  auto conn = conn_.lock();
  if (!conn) return release_slot();
  started_ = std::chrono::steady_clock::now();
  conn->set_drain_handler([weak = weak_from_this()] {
    if (auto self = weak.lock()) self->pump();
  });
  pump();
}

void ChunkPump::resume_from(uint64_t index) {
  if (index < next_) next_ = index;
  pump();
}

void ChunkPump::cancel() {
  cancelled_ = true;
  release_slot();
  if (timer_) timer_->cancel();
  if (auto conn = conn_.lock()) conn->set_drain_handler(nullptr);
}

void ChunkPump::pump() {
  auto conn = conn_.lock();
  if (!conn || !conn->is_open()) return release_slot();
  if (cancelled_) return;
  // Every chunk written (the drain handler runs when the queue empties): the slot is free.
  if (done() && conn->queued_bytes() == 0) return release_slot();
  while (next_ < sender_.num_chunks() && conn->is_open() && conn->queued_bytes() < high_water_) {
    if (rate_ > 0) {
      if (timer_armed_) return;  // the timer resumes
      const auto due = started_ + std::chrono::microseconds(sent_ * 1'000'000 / rate_);
      if (std::chrono::steady_clock::now() < due) {
        timer_armed_ = true;
        timer_->expires_at(due);
        timer_->async_wait([weak = weak_from_this()](const asio::error_code& ec) {
          auto self = weak.lock();
          if (!self) return;
          self->timer_armed_ = false;
          if (!ec) self->pump();
        });
        return;
      }
    }
    // A view into the payload, framed with one copy (the same bytes as a Chunk envelope).
    auto chunk = sender_.chunk_view(next_, &scratch_);
    if (!chunk.ok()) return;
    const uint64_t payload_bytes = chunk->data.size();
    const Status st = conn->send_chunk(*chunk);
    if (st.code() == StatusCode::kResourceExhausted) return;  // the drain handler resumes
    if (!st.ok()) return;                                     // closing: nothing more to do
    ++next_;
    sent_ += payload_bytes;
    if (on_sent_) on_sent_(next_ - 1);
  }
}

}  // namespace starling::edge_client
