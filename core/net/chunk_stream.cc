// Chunked transfers.
#include "core/net/chunk_stream.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/wire/crc32c.h"

namespace starling::net {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }

void Sha256::update(std::string_view data) {
  EVP_DigestUpdate(ctx_.get(), data.data(), data.size());
}

std::string Sha256::finish() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_.get(), md, &n);
  EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), n);
}

Status MemorySource::read(uint64_t offset, std::span<char> out) const {
  if (offset > bytes_.size() || out.size() > bytes_.size() - offset) {
    return out_of_range("read past the end of a payload of " + std::to_string(bytes_.size()) +
                        " bytes");
  }
  if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  return ok_status();
}

ChunkSender::ChunkSender(uint64_t transfer_id, std::string_view payload, uint32_t chunk_bytes,
                         std::string content_type)
    : ChunkSender(transfer_id, std::make_shared<MemorySource>(payload), chunk_bytes,
                  std::move(content_type)) {}

ChunkSender::ChunkSender(uint64_t transfer_id, std::shared_ptr<const PayloadSource> source,
                         uint32_t chunk_bytes, std::string content_type)
    : source_(std::move(source)) {
  const uint64_t total = source_->size();
  header_.set_transfer_id(transfer_id);
  header_.set_total_bytes(total);
  header_.set_chunk_bytes(chunk_bytes);
  header_.set_num_chunks((total + chunk_bytes - 1) / chunk_bytes);
  Sha256 sha;
  if (auto whole = source_->contiguous()) {
    sha.update(*whole);
  } else {
    std::string buf(std::min<uint64_t>(total, 4u << 20), '\0');
    for (uint64_t at = 0; at < total; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), total - at));
      if (!source_->read(at, std::span<char>(buf.data(), n)).ok()) break;
      sha.update(std::string_view(buf.data(), n));
    }
  }
  header_.set_sha256(sha.finish());
  header_.set_content_type(std::move(content_type));
}

Result<wire::ChunkView> ChunkSender::chunk_view(uint64_t index, std::string* scratch) const {
  if (index >= num_chunks()) {
    return out_of_range("chunk " + std::to_string(index) + " of a transfer of " +
                        std::to_string(num_chunks()));
  }
  const uint64_t offset = index * header_.chunk_bytes();
  const size_t n = static_cast<size_t>(
      std::min<uint64_t>(header_.chunk_bytes(), header_.total_bytes() - offset));
  std::string_view data;
  if (auto whole = source_->contiguous()) {
    data = whole->substr(offset, n);
  } else {
    scratch->resize(n);
    RETURN_IF_ERROR(source_->read(offset, std::span<char>(scratch->data(), n)),
                    "reading chunk " + std::to_string(index));
    data = *scratch;
  }
  return wire::ChunkView{header_.transfer_id(), index, data, wire::crc32c(data)};
}

Result<v1::Chunk> ChunkSender::chunk(uint64_t index) const {
  std::string scratch;
  ASSIGN_OR_RETURN(const wire::ChunkView view, chunk_view(index, &scratch));
  v1::Chunk c;
  c.set_transfer_id(view.transfer_id);
  c.set_index(view.index);
  c.set_data(std::string(view.data));
  c.set_crc32c(view.crc32c);
  return c;
}

// SHA-256 on a helper thread, fed in one of two ways:
// - update() copies the bytes into a recycled buffer and returns (at most kMaxPending copied
//   bytes wait: beyond that it blocks until the helper catches up);
// - update_stored() says the sink has stored the payload up to `end`, and the helper hashes it
//   from where it lies: in place from `base` (a buffered receiver's payload, which `owner` keeps
//   alive), or read back a piece at a time through `read_back` (a spill file, from the page
//   cache). The I/O thread neither copies nor waits, and what is not hashed yet costs no memory.
// finish() waits until everything given is hashed.
class ChunkReceiver::BackgroundHash {
 public:
  // Stored mode when base or read_back is set; copying mode otherwise.
  BackgroundHash(const char* base, std::shared_ptr<const void> owner, ReadBack read_back)
      : base_(base),
        owner_(std::move(owner)),
        read_back_(std::move(read_back)),
        thread_([this] { run(); }) {}
  ~BackgroundHash() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  BackgroundHash(const BackgroundHash&) = delete;
  BackgroundHash& operator=(const BackgroundHash&) = delete;

  bool hashes_stored() const { return base_ != nullptr || read_back_; }

  void update(std::string_view data) {
    std::unique_lock lock(mu_);
    cv_.wait(lock,
             [&] { return pending_bytes_ == 0 || pending_bytes_ + data.size() <= kMaxPending; });
    std::string buf;
    if (!free_.empty()) {
      buf = std::move(free_.back());
      free_.pop_back();
    }
    pending_bytes_ += data.size();
    lock.unlock();
    buf.assign(data);  // the copy runs outside the lock
    lock.lock();
    pending_.push_back(std::move(buf));
    cv_.notify_all();
  }

  void update_stored(uint64_t end) {
    std::lock_guard lock(mu_);
    stored_ = end;
    cv_.notify_all();
  }

  Result<std::string> finish() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return pending_bytes_ == 0 && hashed_ == stored_; });
    if (!read_error_.ok()) return read_error_;
    return sha_.finish();  // the worker is idle: nothing is pending
  }

 private:
  static constexpr size_t kMaxPending = 8u << 20;
  static constexpr size_t kMaxFree = 4;
  // Read back a piece at a time: each upload hashing on its helper holds a buffer this size.
  static constexpr size_t kReadBackBytes = 256u << 10;

  // Hashes stored bytes [at, at + n), without the lock.
  void hash_stored(uint64_t at, size_t n) {
    if (base_ != nullptr) return sha_.update(std::string_view(base_ + at, n));
    if (!read_error_.ok()) return;  // the digest is lost anyway
    scratch_.resize(n);
    if (Status st = read_back_(at, std::span<char>(scratch_.data(), n)); !st.ok()) {
      std::lock_guard lock(mu_);
      read_error_ = st.with_context("reading back bytes to hash");
      return;
    }
    sha_.update(std::string_view(scratch_.data(), n));
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !pending_.empty() || hashed_ < stored_; });
      if (stop_) return;
      if (hashed_ < stored_) {
        const uint64_t at = hashed_;
        const auto n = static_cast<size_t>(
            base_ != nullptr ? stored_ - at : std::min<uint64_t>(kReadBackBytes, stored_ - at));
        lock.unlock();
        hash_stored(at, n);
        lock.lock();
        hashed_ = at + n;
        cv_.notify_all();
        continue;
      }
      std::string buf = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      sha_.update(buf);
      lock.lock();
      pending_bytes_ -= buf.size();
      if (free_.size() < kMaxFree) free_.push_back(std::move(buf));
      cv_.notify_all();
    }
  }

  const char* const base_;
  const std::shared_ptr<const void> owner_;  // keeps base_'s bytes alive while hashing
  const ReadBack read_back_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> pending_;
  std::vector<std::string> free_;
  size_t pending_bytes_ = 0;  // copied bytes queued or being hashed
  uint64_t stored_ = 0;       // update_stored(): the sink holds the payload up to here
  uint64_t hashed_ = 0;       // ... and the helper has hashed it up to here
  std::string scratch_;       // pieces read back
  Status read_error_;
  bool stop_ = false;
  Sha256 sha_;
  std::thread thread_;  // last: starts once the members above exist
};

ChunkReceiver::ChunkReceiver(const v1::TransferHeader& header, Sink sink)
    : header_(header), sink_(std::move(sink)) {}
ChunkReceiver::~ChunkReceiver() = default;
ChunkReceiver::ChunkReceiver(ChunkReceiver&&) noexcept = default;
ChunkReceiver& ChunkReceiver::operator=(ChunkReceiver&&) noexcept = default;

Result<ChunkReceiver> ChunkReceiver::create(const v1::TransferHeader& header,
                                            uint64_t max_total_bytes, Sink sink, Hashing hashing,
                                            ReadBack read_back) {
  const std::string id = "transfer " + std::to_string(header.transfer_id());
  if (header.total_bytes() > max_total_bytes) {
    return resource_exhausted(id + " of " + std::to_string(header.total_bytes()) +
                              " bytes exceeds the limit of " + std::to_string(max_total_bytes));
  }
  if (header.chunk_bytes() == 0 ||
      header.num_chunks() !=
          (header.total_bytes() + header.chunk_bytes() - 1) / header.chunk_bytes()) {
    return invalid_argument(id + ": inconsistent chunk size and count");
  }
  if (header.sha256().size() != 32) return invalid_argument(id + ": SHA-256 must be 32 bytes");
  ChunkReceiver r(header, std::move(sink));
  if (hashing == Hashing::kBackground) {
    r.background_ = std::make_unique<BackgroundHash>(nullptr, nullptr, std::move(read_back));
  }
  return r;
}

Result<ChunkReceiver> ChunkReceiver::create_buffered(const v1::TransferHeader& header,
                                                     uint64_t max_total_bytes, Hashing hashing) {
  auto buffer = std::make_shared<std::string>();
  ASSIGN_OR_RETURN(ChunkReceiver r,
                   create(header, max_total_bytes, [buffer](uint64_t, std::string_view data) {
                     buffer->append(data);
                     return ok_status();
                   }));
  buffer->reserve(header.total_bytes());
  r.buffer_ = buffer;
  r.buffer_base_ = buffer->data();
  // The helper hashes the payload where it is collected.
  if (hashing == Hashing::kBackground) {
    r.background_ = std::make_unique<BackgroundHash>(r.buffer_base_, buffer, nullptr);
  }
  return r;
}

Status ChunkReceiver::accept(const v1::Chunk& chunk) { return accept(wire::view_of(chunk)); }

Status ChunkReceiver::accept(const wire::ChunkView& chunk) {
  // The id string is built only on the error paths: this runs once per chunk.
  const auto id = [&] {
    return "transfer " + std::to_string(header_.transfer_id()) + " chunk " +
           std::to_string(chunk.index);
  };
  if (chunk.transfer_id != header_.transfer_id()) {
    return invalid_argument(id() + " belongs to transfer " + std::to_string(chunk.transfer_id));
  }
  if (chunk.index < next_index_) return ok_status();  // a resend we already have
  if (chunk.index > next_index_) {
    return out_of_range(id() + " arrived before chunk " + std::to_string(next_index_));
  }
  const uint64_t offset = chunk.index * header_.chunk_bytes();
  const uint64_t expected =
      std::min<uint64_t>(header_.chunk_bytes(), header_.total_bytes() - offset);
  if (chunk.data.size() != expected) {
    return data_loss(id() + " has " + std::to_string(chunk.data.size()) + " bytes, expected " +
                     std::to_string(expected));
  }
  if (wire::crc32c(chunk.data) != chunk.crc32c) return data_loss(id() + " fails its CRC32C");
  RETURN_IF_ERROR(sink_(offset, chunk.data), id());
  if (background_ && background_->hashes_stored()) {
    // A buffer was reserved whole, so appending never moves what the helper still reads.
    if (buffer_ && buffer_->data() != buffer_base_) {
      return internal_error(id() + ": the receive buffer moved");
    }
    background_->update_stored(offset + chunk.data.size());
  } else if (background_) {
    background_->update(chunk.data);
  } else {
    sha_.update(chunk.data);
  }
  ++next_index_;
  return ok_status();
}

v1::ChunkAck ChunkReceiver::ack() const {
  v1::ChunkAck a;
  a.set_transfer_id(header_.transfer_id());
  a.set_next_index(next_index_);
  a.set_complete(finished_);
  return a;
}

Status ChunkReceiver::finish() {
  if (finished_) return ok_status();
  const std::string id = "transfer " + std::to_string(header_.transfer_id());
  if (!all_received()) {
    return failed_precondition(id + ": " + std::to_string(next_index_) + " of " +
                               std::to_string(header_.num_chunks()) + " chunks received");
  }
  std::string digest;
  if (background_) {
    ASSIGN_OR_RETURN(digest, background_->finish(), id);
  } else {
    digest = sha_.finish();
  }
  if (digest != header_.sha256()) return data_loss(id + ": SHA-256 of the payload differs");
  finished_ = true;
  return ok_status();
}

}  // namespace starling::net
