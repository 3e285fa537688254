// The state a virtual client keeps between the rounds it trains in: its error-feedback residual.
// ClientCodec is a codec whose error feedback works on a residual passed in (so that an idle
// client's residual can live in a ResidualStore rather than in a codec object); ResidualStore
// keeps residuals in memory up to a budget and the rest in files, exactly (f32).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"

namespace starling::sim {

class ClientCodec {
 public:
  // `spec` as for compress::make_codec; `seed` drives the codec's random streams.
  static Result<ClientCodec> create(std::string_view spec, const compress::Layout& layout,
                                    uint64_t seed);
  // True when some tensor's spec has ef=1.
  bool uses_residual() const { return any_ef_; }
  // Encodes delta + residual into `out` and leaves in `residual` what was not sent, exactly as
  // compress::ErrorFeedback does (bit for bit). `residual` is empty (no residual yet: zeros) or
  // of the layout's size; it stays empty when uses_residual() is false.
  Status encode(std::span<const float> delta, std::vector<float>& residual,
                compress::EncodedUpdate& out);

 private:
  ClientCodec() = default;
  std::unique_ptr<compress::Codec> inner_;
  std::vector<uint8_t> mask_;  // per tensor: keeps a residual
  bool any_ef_ = false;
  std::vector<float> corrected_;
  std::vector<float> sent_;
};

// Thread-safe.
class ResidualStore {
 public:
  // Residuals beyond `memory_budget_bytes` go to files in `spill_dir` (created on first use).
  ResidualStore(std::filesystem::path spill_dir, uint64_t memory_budget_bytes)
      : dir_(std::move(spill_dir)), budget_(memory_budget_bytes) {}
  ~ResidualStore();
  ResidualStore(const ResidualStore&) = delete;
  ResidualStore& operator=(const ResidualStore&) = delete;

  // Moves client k's residual out; empty when it has none. A spilled one is read back and its
  // file removed (DataLoss naming the file when it is short or unreadable).
  Result<std::vector<float>> take(int client);
  // Stores client k's residual (an empty one is not stored).
  Status put(int client, std::vector<float> residual);

  struct Stats {
    uint64_t clients = 0;       // clients holding a residual
    uint64_t memory_bytes = 0;  // now
    uint64_t disk_bytes = 0;    // now
    uint64_t peak_memory_bytes = 0;
    uint64_t peak_disk_bytes = 0;
  };
  Stats stats() const;

 private:
  std::filesystem::path file_of(int client) const;

  std::filesystem::path dir_;
  uint64_t budget_;
  mutable std::mutex mu_;
  std::unordered_map<int, std::vector<float>> memory_;
  std::unordered_map<int, uint64_t> on_disk_;  // client -> bytes
  Stats stats_;
};

}  // namespace starling::sim
