// Streamed folding of update streams.
#include "aggregator/stream_fold.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "aggregator/accumulator.h"
#include "aggregator/upload_spill.h"

namespace starling::aggregator {
namespace {

Status io_error(const char* what, const std::string& path) {
  return internal_error(std::string(what) + " " + path + ": " + std::strerror(errno));
}

// One window of one segment: a unit of work that reads and writes nothing another touches
// (segments cover disjoint ranges of the model, windows disjoint ranges of their segment).
struct Window {
  size_t segment = 0;
  int64_t begin = 0;
  int64_t n = 0;
};

std::vector<Window> windows_of(const compress::UpdateStreamLayout& layout, int64_t target) {
  std::vector<Window> out;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const auto& meta = layout.segments[i].meta;
    const int64_t step = compress::stream_window_elements(meta, target);
    if (step == 0 || meta.numel == 0) {
      out.push_back({i, 0, meta.numel});
      continue;
    }
    for (int64_t b = 0; b < meta.numel; b += step)
      out.push_back({i, b, std::min(step, meta.numel - b)});
  }
  return out;
}

// Runs fn(window, scratch segment) for every window on up to `threads` threads, each window on
// one thread; returns the error of the first failing window in window order (so the result does
// not depend on the thread count or the schedule).
template <typename Fn>
Status for_windows(const std::vector<Window>& windows, int threads, Fn&& fn) {
  std::vector<Status> status(windows.size());
  const int nt = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(windows.size(), 1)));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    compress::Segment win;
#pragma omp for schedule(dynamic, 1)
    for (size_t k = 0; k < windows.size(); ++k) status[k] = fn(windows[k], win);
  }
  for (Status& st : status) {
    if (!st.ok()) return std::move(st);
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

namespace {

// The fold of fold_update_stream; `memory`, when not null, is the whole payload, whose identity,
// int8 and QSGD windows are then read in place rather than copied.
Result<StreamFoldResult> fold_stream(const compress::ReadAt& read, uint64_t total_bytes,
                                     const std::string_view* memory, SumWindows& sum, float weight,
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
  // Only a sum in memory takes windows from several threads at once (FileSum is not
  // thread-safe); the windows of a file sum go one at a time.
  const bool in_memory = dynamic_cast<MemorySum*>(&sum) != nullptr;
  const int threads = std::max(1, options.threads);
  const std::vector<Window> windows = windows_of(layout, options.window_elements);
  std::vector<double> norm2_of(windows.size(), 0.0);
  // Pass 1: everything checked before the sum is touched.
  const Status checked =
      for_windows(windows, threads, [&](const Window& w, compress::Segment& win) {
        const auto& seg = layout.segments[w.segment];
        if (memory != nullptr && compress::reads_in_place(seg.meta)) {
          double s2 = 0.0;
          const Status st = compress::check_window_in_place(*memory, seg, w.segment, w.begin, w.n,
                                                            clip ? &s2 : nullptr);
          if (!st.ok()) {
            return st.code() == StatusCode::kDataLoss ? st.with_context("update rejected") : st;
          }
          norm2_of[static_cast<size_t>(&w - windows.data())] = s2;
          return ok_status();
        }
        RETURN_IF_ERROR(compress::load_stream_window(read, seg, w.begin, w.n, win));
        RETURN_IF_ERROR(compress::check_segment(win, w.segment), "update rejected");
        if (!segment_is_finite(win)) {
          return invalid_argument("update holds non-finite values (segment " +
                                  std::to_string(w.segment) + ")");
        }
        if (clip) {
          std::vector<float> scratch(static_cast<size_t>(w.n), 0.0f);
          RETURN_IF_ERROR(compress::decode_add_segment(win, w.segment, scratch, 1.0f));
          double s2 = 0.0;
          for (float v : scratch) s2 += static_cast<double>(v) * v;
          norm2_of[static_cast<size_t>(&w - windows.data())] = s2;
        }
        return ok_status();
      });
  RETURN_IF_ERROR(checked);
  double norm2 = 0.0;
  for (double s2 : norm2_of) norm2 += s2;  // in window order: the same for any thread count
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
  // Pass 2: the fold, each window into its own range of the sum, so every element sees the
  // same arithmetic whatever the thread count (bit-identical sums). The stream was checked;
  // what can still fail is reading it again.
  const Status folded = for_windows(
      windows, in_memory ? threads : 1, [&](const Window& win_of, compress::Segment& win) {
        const auto& seg = layout.segments[win_of.segment];
        if (memory != nullptr && compress::reads_in_place(seg.meta)) {
          return sum.update(seg.meta.offset + win_of.begin, win_of.n, [&](std::span<float> dst) {
            compress::add_window_in_place(*memory, seg, win_of.begin, win_of.n, dst.data(), w);
          });
        }
        RETURN_IF_ERROR(compress::load_stream_window(read, seg, win_of.begin, win_of.n, win));
        Status added = ok_status();
        const Status io =
            sum.update(seg.meta.offset + win_of.begin, win_of.n, [&](std::span<float> dst) {
              added = compress::decode_add_segment(win, win_of.segment, dst, w);
            });
        return io.ok() ? added : io;
      });
  RETURN_IF_ERROR(folded);
  return result;
}

}  // namespace

Result<StreamFoldResult> fold_update_stream(const compress::ReadAt& read, uint64_t total_bytes,
                                            SumWindows& sum, float weight,
                                            const StreamFoldOptions& options) {
  return fold_stream(read, total_bytes, nullptr, sum, weight, options);
}

Result<StreamFoldResult> fold_update_stream(std::string_view payload, SumWindows& sum, float weight,
                                            const StreamFoldOptions& options) {
  return fold_stream(compress::read_from_memory(payload), payload.size(), &payload, sum, weight,
                     options);
}

}  // namespace starling::aggregator
