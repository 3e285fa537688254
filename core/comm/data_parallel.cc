// DataParallel: bucket assignment, the model check across ranks, and the per-step bucket
// pipeline (hook -> ready bucket -> worker all-reduce -> gradients written back).
#include "core/comm/data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/autograd/autograd.h"

namespace starling::comm {

namespace {

// What every rank must agree on, as floats that hold small integers exactly (all_gather moves
// floats): ok flag, parameter count, element count and a hash of names, shapes and dtypes.
constexpr size_t kFingerprint = 7;

std::vector<float> fingerprint(const std::vector<std::pair<std::string, Tensor>>& params, bool ok) {
  if (!ok) return std::vector<float>(kFingerprint, 0.0f);  // a parameter may be undefined
  uint64_t h = 1469598103934665603ull;                     // FNV-1a
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  uint64_t numel = 0;
  for (const auto& [name, t] : params) {
    for (char c : name) mix(static_cast<unsigned char>(c));
    mix(static_cast<uint64_t>(t.dtype()));
    for (int64_t d : t.shape()) mix(static_cast<uint64_t>(d));
    numel += static_cast<uint64_t>(t.numel());
  }
  auto lo = [](uint64_t v) { return static_cast<float>(v & 0xffffff); };
  auto hi = [](uint64_t v) { return static_cast<float>((v >> 24) & 0xffffff); };
  const uint64_t n = params.size();
  return {ok ? 1.0f : 0.0f, hi(n), lo(n), hi(numel), lo(numel), hi(h), lo(h)};
}

uint64_t unpack(float hi, float lo) {
  return (static_cast<uint64_t>(hi) << 24) | static_cast<uint64_t>(lo);
}

}  // namespace

Result<std::unique_ptr<DataParallel>> DataParallel::make(
    std::vector<std::pair<std::string, Tensor>> params, Communicator& comm,
    DataParallelOptions options) {
  const std::string ctx = "data parallel: rank " + std::to_string(comm.rank());
  // A local problem is reported through the fingerprint so that every rank still takes part
  // in the check and learns about it (no rank is left waiting).
  Status local;
  for (const auto& [name, t] : params) {
    if (!t.defined() || t.dtype() != DType::kF32 || !t.is_contiguous()) {
      local = invalid_argument("parameter '" + name + "' must be a defined, contiguous f32 tensor");
      break;
    }
  }
  const std::vector<float> mine = fingerprint(params, local.ok());
  std::vector<float> all(mine.size() * static_cast<size_t>(comm.size()));
  RETURN_IF_ERROR(comm.all_gather(mine, all), ctx + ": comparing models");
  if (!local.ok()) return local.with_context(ctx);
  for (int r = 0; r < comm.size(); ++r) {
    const float* f = all.data() + kFingerprint * static_cast<size_t>(r);
    if (f[0] == 0.0f) {
      return invalid_argument(ctx + ": rank " + std::to_string(r) + " has an invalid parameter");
    }
    const float* f0 = all.data();
    if (!std::equal(f, f + kFingerprint, f0)) {
      return invalid_argument(
          ctx + ": rank " + std::to_string(r) + "'s model differs from rank 0's (" +
          std::to_string(unpack(f[1], f[2])) + " parameters, " +
          std::to_string(unpack(f[3], f[4])) + " elements vs " +
          std::to_string(unpack(f0[1], f0[2])) + ", " + std::to_string(unpack(f0[3], f0[4])) +
          (unpack(f[3], f[4]) == unpack(f0[3], f0[4]) ? "; names or shapes differ)" : ")"));
    }
  }

  std::unique_ptr<DataParallel> dp(new DataParallel(std::move(params), comm, options));
  if (options.broadcast_parameters) {
    for (size_t b = 0; b < dp->buckets_.size(); ++b) {
      Bucket& bk = dp->buckets_[b];
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const Tensor& p = dp->params_[bk.params[j]].second;
        std::memcpy(bk.flat.data() + bk.offsets[j], p.data<float>(),
                    static_cast<size_t>(p.numel()) * sizeof(float));
      }
      RETURN_IF_ERROR(comm.broadcast(bk.flat, 0),
                      ctx + ": broadcasting parameters of bucket " + std::to_string(b));
      for (size_t j = 0; j < bk.params.size(); ++j) {
        Tensor p = dp->params_[bk.params[j]].second;
        std::memcpy(p.data<float>(), bk.flat.data() + bk.offsets[j],
                    static_cast<size_t>(p.numel()) * sizeof(float));
      }
    }
  }
  if (options.overlap) dp->worker_ = std::thread([d = dp.get()] { d->worker_loop(); });
  return dp;
}

DataParallel::DataParallel(std::vector<std::pair<std::string, Tensor>> params, Communicator& comm,
                           DataParallelOptions options)
    : params_(std::move(params)), comm_(comm), options_(options) {
  assign_buckets();
  param_index_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    param_index_.emplace_back(params_[i].second.impl().get(), i);
  }
  std::sort(param_index_.begin(), param_index_.end());
  grads_.resize(params_.size());
  seen_.assign(params_.size(), false);
  reset_step();
}

DataParallel::~DataParallel() {
  if (worker_.joinable()) {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

void DataParallel::assign_buckets() {
  // Reverse registration order: roughly the order in which backward finishes gradients.
  bucket_of_.assign(params_.size(), 0);
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const size_t pbytes = static_cast<size_t>(params_[k].second.numel()) * sizeof(float);
    if (buckets_.empty() ||
        (!buckets_.back().params.empty() && bytes + pbytes > options_.bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(bytes / sizeof(float));
    b.params.push_back(k);
    bytes += pbytes;
    b.flat.resize(bytes / sizeof(float));
    bucket_of_[k] = buckets_.size() - 1;
  }
}

std::vector<std::vector<size_t>> DataParallel::bucket_params() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

void DataParallel::reset_step() {
  for (auto& b : buckets_) b.pending = b.params.size();
  std::fill(seen_.begin(), seen_.end(), false);
  for (auto& g : grads_) g = Tensor();
  next_launch_ = 0;
  step_error_ = ok_status();
  std::lock_guard lk(mu_);
  completed_ = 0;
  worker_error_ = ok_status();
}

Status DataParallel::backward(const Tensor& loss) {
  autograd::backward(loss, Tensor(), [this](const Tensor& leaf) { grad_ready(leaf); });
  return finish();
}

void DataParallel::grad_ready(const Tensor& leaf) {
  const void* key = leaf.impl().get();
  auto it =
      std::lower_bound(param_index_.begin(), param_index_.end(), std::make_pair(key, size_t{0}));
  if (it == param_index_.end() || it->first != key) return;
  const size_t i = it->second;
  if (seen_[i]) {
    if (step_error_.ok()) {
      step_error_ = failed_precondition("parameter '" + params_[i].first +
                                        "' got a gradient twice before finish()");
    }
    return;
  }
  grads_[i] = leaf.grad();
  mark_ready(i);
}

void DataParallel::mark_ready(size_t i) {
  seen_[i] = true;
  Bucket& b = buckets_[bucket_of_[i]];
  if (--b.pending == 0 && options_.overlap) launch_ready_buckets();
}

void DataParallel::launch_ready_buckets() {
  // In index order only, so every rank issues the same collectives in the same order even if
  // its backward reported gradients in another order.
  size_t first = next_launch_;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) ++next_launch_;
  if (first == next_launch_) return;
  {
    std::lock_guard lk(mu_);
    for (size_t b = first; b < next_launch_; ++b) queue_.push_back(b);
  }
  cv_.notify_all();
}

Status DataParallel::reduce_bucket(size_t b) {
  Bucket& bk = buckets_[b];
  for (size_t j = 0; j < bk.params.size(); ++j) {
    const Tensor& g = grads_[bk.params[j]];
    std::memcpy(bk.flat.data() + bk.offsets[j], g.data<float>(),
                static_cast<size_t>(g.numel()) * sizeof(float));
  }
  RETURN_IF_ERROR(comm_.all_reduce(bk.flat, ReduceOp::kAvg),
                  "data parallel: bucket " + std::to_string(b) + " (parameter '" +
                      params_[bk.params.front()].first + "' and " +
                      std::to_string(bk.params.size() - 1) + " more)");
  for (size_t j = 0; j < bk.params.size(); ++j) {
    Tensor g = grads_[bk.params[j]];
    std::memcpy(g.data<float>(), bk.flat.data() + bk.offsets[j],
                static_cast<size_t>(g.numel()) * sizeof(float));
  }
  return ok_status();
}

void DataParallel::worker_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    const size_t b = queue_.front();
    queue_.pop_front();
    // After an error the communicator is broken: the remaining buckets are only counted.
    const bool skip = !worker_error_.ok();
    lk.unlock();
    Status st = skip ? ok_status() : reduce_bucket(b);
    lk.lock();
    if (!st.ok() && worker_error_.ok()) worker_error_ = std::move(st);
    ++completed_;
    cv_.notify_all();
  }
}

Status DataParallel::finish() {
  // Parameters without a gradient this step contribute zeros (the same on every rank's layout).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (seen_[i]) continue;
    Tensor p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) {
      g = Tensor::zeros(p.shape(), p.dtype());
      p.set_grad(g);
    }
    grads_[i] = g;
    seen_[i] = true;
    --buckets_[bucket_of_[i]].pending;
  }
  Status result;
  if (options_.overlap) {
    launch_ready_buckets();
    std::unique_lock lk(mu_);
    cv_.wait(lk, [this] { return completed_ == buckets_.size(); });
    result = worker_error_;
  } else {
    for (size_t b = 0; b < buckets_.size() && result.ok(); ++b) result = reduce_bucket(b);
  }
  if (result.ok()) result = step_error_;
  reset_step();
  return result;
}

}  // namespace starling::comm
