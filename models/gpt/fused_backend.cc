#include "models/gpt/fused_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace starling::models {

void FusedBackend::set_profiling(bool on) {
  profiling_ = on;
  if (!on) spans_.clear();
}

void FusedBackend::profile_begin(const char* label) {
  spans_.push_back(Span{label, time_mark(), nullptr});
}

void FusedBackend::profile_end() {
  if (!spans_.empty() && !spans_.back().to) spans_.back().to = time_mark();
}

std::vector<FusedBackend::ProfileEntry> FusedBackend::take_profile() {
  synchronize();
  std::vector<ProfileEntry> out;
  for (const auto& s : spans_) {
    if (!s.to) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const ProfileEntry& e) { return e.label == s.label; });
    if (it == out.end()) it = out.insert(out.end(), ProfileEntry{s.label, 0.0, 0});
    it->ms += elapsed_ms(s.from, s.to);
    ++it->calls;
  }
  spans_.clear();
  return out;
}

namespace {

// The host codec over host memory (the CPU backend's).
class HostUpdateCodec final : public FusedUpdateCodec {
 public:
  HostUpdateCodec(std::unique_ptr<compress::Codec> codec, int64_t numel)
      : codec_(std::move(codec)), numel_(numel) {}
  Status encode_into(const float* delta, compress::EncodedUpdate& out) override {
    return codec_->encode_into(std::span<const float>(delta, static_cast<size_t>(numel_)), out);
  }
  std::vector<float> persistent_state() override {
    const auto s = codec_->persistent_state();
    return std::vector<float>(s.begin(), s.end());
  }
  Status restore_state(std::span<const float> state) override {
    return codec_->restore_state(state);
  }

 private:
  std::unique_ptr<compress::Codec> codec_;
  int64_t numel_;
};

}  // namespace

Result<std::unique_ptr<FusedUpdateCodec>> FusedBackend::make_update_codec(
    std::string_view spec, const compress::Layout& layout, uint64_t seed) {
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout));
  ASSIGN_OR_RETURN(auto codec, compress::make_codec(spec, layout, seed));
  return std::unique_ptr<FusedUpdateCodec>(
      std::make_unique<HostUpdateCodec>(std::move(codec), numel));
}

std::shared_ptr<void> FusedBackend::time_mark() {
  return std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
}

double FusedBackend::elapsed_ms(const std::shared_ptr<void>& from,
                                const std::shared_ptr<void>& to) {
  const auto* a = static_cast<const std::chrono::steady_clock::time_point*>(from.get());
  const auto* b = static_cast<const std::chrono::steady_clock::time_point*>(to.get());
  return std::chrono::duration<double, std::milli>(*b - *a).count();
}

std::string fused_profile_table(const std::vector<FusedBackend::ProfileEntry>& entries, int steps,
                                double step_ms) {
  std::vector<FusedBackend::ProfileEntry> sorted = entries;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.ms > b.ms; });
  const double n = std::max(1, steps);
  std::string out = "| operation | calls/step | ms/step | % of step |\n|---|---|---|---|\n";
  double sum = 0.0;
  char line[256];
  for (const auto& e : sorted) {
    const double ms = e.ms / n;
    sum += ms;
    std::snprintf(line, sizeof line, "| %s | %.0f | %.3f | %.1f%% |\n", e.label.c_str(),
                  static_cast<double>(e.calls) / n, ms, step_ms > 0 ? 100.0 * ms / step_ms : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "| (sum of the above) | | %.3f | %.1f%% |\n", sum,
                step_ms > 0 ? 100.0 * sum / step_ms : 0.0);
  out += line;
  std::snprintf(line, sizeof line, "| (rest of the step: host, gaps) | | %.3f | %.1f%% |\n",
                step_ms - sum, step_ms > 0 ? 100.0 * (step_ms - sum) / step_ms : 0.0);
  out += line;
  return out;
}

}  // namespace starling::models
