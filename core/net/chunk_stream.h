// Chunked transfers: a payload of any size (models beyond 2 GB included) travels as Chunk
// messages of at most chunk_bytes, each with a CRC32C, the whole with a SHA-256. The receiver
// accepts chunks in order, so a transfer resumes from ChunkAck.next_index after a corrupt
// chunk or a reconnect. Lives in net/ because SHA-256 comes from OpenSSL.
#pragma once

#include <openssl/evp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/util/status.h"
#include "core/wire/chunk_frame.h"
#include "core/wire/messages.pb.h"

namespace starling::net {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  std::string finish();  // 32 raw bytes; the object is reset afterwards
 private:
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx_;
};

// Where a sender's payload comes from: memory, a file, or bytes generated on demand, so that a
// payload larger than memory can be sent a chunk at a time.
class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  virtual uint64_t size() const = 0;
  // Copies bytes [offset, offset + out.size()). REQUIRES: offset + out.size() <= size().
  virtual Status read(uint64_t offset, std::span<char> out) const = 0;
  // The whole payload when it lies in memory (chunks are then views into it); else nullopt.
  virtual std::optional<std::string_view> contiguous() const { return std::nullopt; }
};

// A payload in memory, which must outlive the source.
class MemorySource : public PayloadSource {
 public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  Status read(uint64_t offset, std::span<char> out) const override;
  std::optional<std::string_view> contiguous() const override { return bytes_; }

 private:
  std::string_view bytes_;
};

// Splits a payload into chunks. The header's SHA-256 is computed at construction (one pass over
// the source).
class ChunkSender {
 public:
  // The payload must outlive the sender. REQUIRES: chunk_bytes > 0.
  ChunkSender(uint64_t transfer_id, std::string_view payload, uint32_t chunk_bytes,
              std::string content_type = "");
  // REQUIRES: chunk_bytes > 0; the source reads without error (a failed read is Internal from
  // chunk_view(), and the digest of the header is then wrong).
  ChunkSender(uint64_t transfer_id, std::shared_ptr<const PayloadSource> source,
              uint32_t chunk_bytes, std::string content_type = "");
  const v1::TransferHeader& header() const { return header_; }
  uint64_t num_chunks() const { return header_.num_chunks(); }
  // Chunk `index` with its CRC32C. OutOfRange for index >= num_chunks().
  Result<v1::Chunk> chunk(uint64_t index) const;
  // The same without copying the data when the source is contiguous: a view into the payload,
  // for Connection::send_chunk(). Otherwise the bytes are read into *scratch (REQUIRES: not
  // null), which the view then points into.
  Result<wire::ChunkView> chunk_view(uint64_t index, std::string* scratch = nullptr) const;

 private:
  std::shared_ptr<const PayloadSource> source_;
  v1::TransferHeader header_;
};

// Receives the chunks of one transfer in order and hands their bytes to a sink, so that a
// large payload need not be held in memory (the aggregator folds updates in as they arrive).
class ChunkReceiver {
 public:
  using Sink = std::function<Status(uint64_t offset, std::string_view data)>;
  // Reads back bytes [offset, offset + out.size()) that the sink has stored.
  using ReadBack = std::function<Status(uint64_t offset, std::span<char> out)>;
  // Where the whole-payload SHA-256 runs. kBackground hashes on a helper thread owned by the
  // receiver, so hashing (the largest cost of receiving) overlaps with decrypting the next
  // chunks on the I/O thread, and several receivers hash on several cores. The helper hashes
  // what has been stored behind the sink: a buffered receiver's payload in place, or through
  // read_back (a spill file); without either each chunk is copied for it (at most 8 MiB wait:
  // accept() blocks beyond that).
  enum class Hashing { kInline, kBackground };
  // Below this size a helper thread costs more than hashing inline saves.
  static constexpr uint64_t kBackgroundHashMinBytes = 4u << 20;

  // Validates an untrusted header: sizes consistent, below max_total_bytes, 32-byte digest.
  // read_back is used with kBackground only.
  static Result<ChunkReceiver> create(const v1::TransferHeader& header, uint64_t max_total_bytes,
                                      Sink sink, Hashing hashing = Hashing::kInline,
                                      ReadBack read_back = {});
  // A receiver that collects the payload in memory; see take_payload().
  static Result<ChunkReceiver> create_buffered(const v1::TransferHeader& header,
                                               uint64_t max_total_bytes,
                                               Hashing hashing = Hashing::kInline);
  ~ChunkReceiver();
  ChunkReceiver(ChunkReceiver&&) noexcept;
  ChunkReceiver& operator=(ChunkReceiver&&) noexcept;

  // Accepts chunk next_index(). A duplicate of an earlier chunk is ignored (OK). DataLoss for a
  // CRC mismatch or a wrong length (re-request from next_index()); OutOfRange for a gap;
  // InvalidArgument for another transfer's chunk.
  Status accept(const v1::Chunk& chunk);
  // The same for a chunk borrowed from the receive buffer (Connection's chunk handler).
  Status accept(const wire::ChunkView& chunk);
  // Index of the first chunk not yet received intact: the resume point.
  uint64_t next_index() const { return next_index_; }
  v1::ChunkAck ack() const;
  bool all_received() const { return next_index_ == header_.num_chunks(); }
  // After the last chunk: DataLoss unless the SHA-256 of everything received matches (then
  // the whole transfer must be sent again: the digest cannot say which chunk was wrong).
  Status finish();
  // The collected payload of a buffered receiver, after finish() succeeded.
  std::string take_payload() { return std::move(*buffer_); }

 private:
  class BackgroundHash;
  ChunkReceiver(const v1::TransferHeader& header, Sink sink);

  v1::TransferHeader header_;
  Sink sink_;
  std::shared_ptr<std::string> buffer_;
  const char* buffer_base_ = nullptr;  // buffer_->data() once reserved
  Sha256 sha_;
  std::unique_ptr<BackgroundHash> background_;  // set for Hashing::kBackground
  uint64_t next_index_ = 0;
  bool finished_ = false;
};

}  // namespace starling::net
