// Streamed folding of update streams.
#include "aggregator/stream_fold.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "aggregator/accumulator.h"
#include "aggregator/upload_spill.h"

namespace starling::aggregator {
namespace {

Status io_error(const char* what, const std::string& path) {
  return internal_error(std::string(what) + " " + path + ": " + std::strerror(errno));
}

// Calls fn(begin, n) for the windows in which segment `seg` is read.
template <typename Fn>
Status for_each_window(const compress::StreamSegment& seg, int64_t target, Fn&& fn) {
  const int64_t step = compress::stream_window_elements(seg.meta, target);
  const int64_t numel = seg.meta.numel;
  if (step == 0 || numel == 0) return fn(int64_t{0}, numel);
  for (int64_t begin = 0; begin < numel; begin += step) {
    RETURN_IF_ERROR(fn(begin, std::min(step, numel - begin)));
  }
  return ok_status();
}

}  // namespace

Status MemorySum::update(int64_t offset, int64_t n,
                         const std::function<void(std::span<float>)>& fn) {
  fn(sum_.subspan(static_cast<size_t>(offset), static_cast<size_t>(n)));
  return ok_status();
}

Result<std::unique_ptr<FileSum>> FileSum::create(const std::filesystem::path& path, int64_t numel) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("cannot create the sum file", path.string());
  if (::ftruncate(fd, static_cast<off_t>(numel) * 4) != 0) {
    const Status st = io_error("cannot size the sum file", path.string());
    ::close(fd);
    return st;
  }
  return std::unique_ptr<FileSum>(new FileSum(fd, path.string(), numel));
}

FileSum::~FileSum() { ::close(fd_); }

Status FileSum::read(int64_t offset, std::span<float> out) const {
  return read_all_at(fd_, static_cast<uint64_t>(offset) * 4,
                     std::span<char>(reinterpret_cast<char*>(out.data()), out.size_bytes()),
                     "the sum file " + path_);
}

Status FileSum::update(int64_t offset, int64_t n, const std::function<void(std::span<float>)>& fn) {
  window_.resize(static_cast<size_t>(n));
  RETURN_IF_ERROR(read(offset, window_));
  fn(window_);
  return write_all_at(
      fd_, static_cast<uint64_t>(offset) * 4,
      std::span<const char>(reinterpret_cast<const char*>(window_.data()), window_.size() * 4),
      "the sum file " + path_);
}

Result<StreamFoldResult> fold_update_stream(const compress::ReadAt& read, uint64_t total_bytes,
                                            SumWindows& sum, float weight,
                                            const StreamFoldOptions& options) {
  if (!(weight > 0.0f) || !std::isfinite(weight)) {
    return invalid_argument("update weight " + std::to_string(weight) + " is not positive");
  }
  ASSIGN_OR_RETURN(const compress::UpdateStreamLayout layout,
                   compress::read_update_stream_header(read, total_bytes));
  if (layout.numel != sum.numel()) {
    return invalid_argument("update of " + std::to_string(layout.numel) +
                            " elements for a model of " + std::to_string(sum.numel()));
  }
  const bool clip = options.clip_norm > 0;
  compress::Segment win;
  std::vector<float> scratch;
  double norm2 = 0.0;
  // Pass 1: everything checked before the sum is touched.
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const auto& seg = layout.segments[i];
    const Status checked = for_each_window(seg, options.window_elements, [&](int64_t b, int64_t n) {
      RETURN_IF_ERROR(compress::load_stream_window(read, seg, b, n, win));
      RETURN_IF_ERROR(compress::check_segment(win, i), "update rejected");
      if (!segment_is_finite(win)) {
        return invalid_argument("update holds non-finite values (segment " + std::to_string(i) +
                                ")");
      }
      if (clip) {
        scratch.assign(static_cast<size_t>(n), 0.0f);
        RETURN_IF_ERROR(compress::decode_add_segment(win, i, scratch, 1.0f));
        for (float v : scratch) norm2 += static_cast<double>(v) * v;
      }
      return ok_status();
    });
    RETURN_IF_ERROR(checked);
  }
  StreamFoldResult result;
  result.numel = layout.numel;
  float w = weight;
  if (clip) {
    result.norm = std::sqrt(norm2);
    if (!std::isfinite(result.norm)) return invalid_argument("update norm overflows");
    if (result.norm > options.clip_norm) {
      w = weight * static_cast<float>(options.clip_norm / result.norm);
      result.clipped = true;
    }
  }
  // Pass 2: the fold. The stream was checked; what can still fail is reading it again.
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const auto& seg = layout.segments[i];
    const Status folded = for_each_window(seg, options.window_elements, [&](int64_t b, int64_t n) {
      RETURN_IF_ERROR(compress::load_stream_window(read, seg, b, n, win));
      Status added = ok_status();
      const Status io = sum.update(seg.meta.offset + b, n, [&](std::span<float> dst) {
        added = compress::decode_add_segment(win, i, dst, w);
      });
      return io.ok() ? added : io;
    });
    RETURN_IF_ERROR(folded);
  }
  return result;
}

}  // namespace starling::aggregator
