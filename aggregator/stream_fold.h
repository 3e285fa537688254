// Folding an update stream (core/compress/update_stream.h) a window at a time: memory is a
// window of the update and of the sum, however large the update, for the dense and block codecs
// (identity, fp16, bf16, int8, QSGD, sign); sparse and low-rank segments (top-k, random-k,
// PowerSGD) are loaded one whole segment at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "core/compress/update_stream.h"
#include "core/util/status.h"

namespace starling::aggregator {

// The running sum a streamed fold adds into.
class SumWindows {
 public:
  virtual ~SumWindows() = default;
  virtual int64_t numel() const = 0;
  // Calls fn with elements [offset, offset + n) of the sum, writable; what fn leaves there is
  // kept. REQUIRES: 0 <= offset, offset + n <= numel().
  virtual Status update(int64_t offset, int64_t n,
                        const std::function<void(std::span<float>)>& fn) = 0;
};

// A sum held in memory.
class MemorySum : public SumWindows {
 public:
  explicit MemorySum(std::span<float> sum) : sum_(sum) {}
  int64_t numel() const override { return static_cast<int64_t>(sum_.size()); }
  Status update(int64_t offset, int64_t n,
                const std::function<void(std::span<float>)>& fn) override;

 private:
  std::span<float> sum_;
};

// A sum of numel floats in a file (created sparse, all zeros), read and written a window at a
// time: for sums larger than memory. Not thread-safe.
class FileSum : public SumWindows {
 public:
  static Result<std::unique_ptr<FileSum>> create(const std::filesystem::path& path, int64_t numel);
  ~FileSum() override;
  FileSum(const FileSum&) = delete;
  FileSum& operator=(const FileSum&) = delete;
  int64_t numel() const override { return numel_; }
  Status update(int64_t offset, int64_t n,
                const std::function<void(std::span<float>)>& fn) override;
  // Elements [offset, offset + out.size()).
  Status read(int64_t offset, std::span<float> out) const;

 private:
  FileSum(int fd, std::string path, int64_t numel)
      : fd_(fd), path_(std::move(path)), numel_(numel) {}
  int fd_;
  std::string path_;
  int64_t numel_;
  std::vector<float> window_;
};

struct StreamFoldOptions {
  double clip_norm = 0.0;             // > 0: scale the update to L2 norm at most this
  int64_t window_elements = 1 << 22;  // 16 MiB of f32 per window
  // Threads that check and fold windows at once (a sum in memory only; a FileSum takes one).
  // Each window lands in its own range of the sum, so the result is bit-identical for any
  // count, and the first error in window order is the one returned.
  int threads = 1;
};

struct StreamFoldResult {
  int64_t numel = 0;
  double norm = 0.0;  // L2 norm of the decoded update (computed only when clipping)
  bool clipped = false;
};

// sum += weight * decode(update) for the update stream of `total_bytes` that `read` serves.
// The whole stream is checked first (header, sizes, codec checks, finite values, and the norm
// when clipping), so on any error the sum is unchanged and the error says why. Reads every
// window twice: the stream should be where rereading is cheap (memory, a local file).
Result<StreamFoldResult> fold_update_stream(const compress::ReadAt& read, uint64_t total_bytes,
                                            SumWindows& sum, float weight,
                                            const StreamFoldOptions& options = {});
// The same for a payload held whole in memory: identity, int8 and QSGD windows are checked and
// folded in place (each byte read from memory once per pass, never copied), the other codecs'
// windows loaded as above. The same sums, bit for bit.
Result<StreamFoldResult> fold_update_stream(std::string_view payload, SumWindows& sum, float weight,
                                            const StreamFoldOptions& options = {});

}  // namespace starling::aggregator
