// [cuda] The update codec kernels (core/cuda/codec_kernels.h) against their CPU oracles in
// core/compress: int8, top-k and random-k bit for bit, PowerSGD's products within fp32 rounding;
// GpuCodec / GpuDecoder (codec_gpu.h) against make_codec / decode_add on whole layouts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/compress/internal/kernels.h"
#include "core/cuda/codec_gpu.h"
#include "core/cuda/codec_kernels.h"
#include "tests/cuda/cuda_testing.h"

namespace starling::cuda {
namespace {

namespace cc = ::starling::compress;
namespace ci = ::starling::compress::internal;
using testing::random_floats;
using testing::require_close;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <typename T>
std::vector<T> to_host_synced(const DeviceArray<T>& a) {
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  return a.to_host();
}

// Host-to-device copies from pageable memory may still be in flight when cudaMemcpy returns, and
// a non-blocking stream does not wait for the legacy one: settle before using such a stream.
void settle() { STARLING_CUDA_CHECK(cudaDeviceSynchronize()); }

DeviceArray<unsigned> zero_flag() { return DeviceArray<unsigned>::from_host({0u}); }

// N(0, 1) values with the awkward cases: every fifth one rounded to a quarter (ties of |x|, also
// between +v and -v), block 1 all zeros (+0 and -0), block 2 scaled by 1e-30 (tiny, but absmax
// still above 127 / FLT_MAX), block 3 by 1e30, and the last element -x[0].
std::vector<float> awkward(size_t n, size_t block, uint64_t seed) {
  auto v = random_floats(n, seed);
  for (size_t i = 0; i < n; i += 5) v[i] = std::round(v[i] * 4.0f) / 4.0f;
  for (size_t i = block; i < std::min(n, 2 * block); ++i) v[i] = i % 2 ? 0.0f : -0.0f;
  for (size_t i = 2 * block; i < std::min(n, 3 * block); ++i) v[i] *= 1e-30f;
  for (size_t i = 3 * block; i < std::min(n, 4 * block); ++i) v[i] *= 1e30f;
  if (n > 1) v[n - 1] = -v[0];
  return v;
}

TEST_CASE("int8 encode matches quantize_int8_scalar bit for bit", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const size_t n =
      GENERATE(size_t{1}, size_t{31}, size_t{256}, size_t{257}, size_t{4099}, size_t{100003});
  const int block = GENERATE(1, 7, 32, 256, 1000);
  INFO("n " << n << " block " << block);
  const size_t ub = static_cast<size_t>(block), nb = (n + ub - 1) / ub;
  const auto x = awkward(n, ub, n * 31 + ub);
  std::vector<int8_t> q(n);
  std::vector<float> scales(nb);
  REQUIRE(ci::quantize_int8_scalar(x.data(), n, ub, q.data(), scales.data()));

  auto dx = DeviceArray<float>::from_host(x);
  DeviceArray<int8_t> dq(n);
  DeviceArray<float> ds(nb);
  auto flag = zero_flag();
  int8_encode(dq.get(), ds.get(), flag.get(), dx.get(), n, block, nullptr);
  REQUIRE(to_host_synced(flag)[0] == 0u);
  REQUIRE(dq.to_host() == q);
  REQUIRE(same_bits(ds.to_host(), scales));
}

TEST_CASE("int8 encode flags inf and NaN", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const float bad =
      GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
               std::numeric_limits<float>::quiet_NaN());
  auto x = random_floats(1000, 3);
  x[517] = bad;
  auto dx = DeviceArray<float>::from_host(x);
  DeviceArray<int8_t> dq(x.size());
  DeviceArray<float> ds(8);
  auto flag = zero_flag();
  int8_encode(dq.get(), ds.get(), flag.get(), dx.get(), x.size(), 128, nullptr);
  REQUIRE(to_host_synced(flag)[0] != 0u);
}

TEST_CASE("int8 decode_add matches add_i8 bit for bit", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const size_t n = GENERATE(size_t{1}, size_t{300}, size_t{4099});
  const int block = GENERATE(1, 64, 256);
  const float mul = GENERATE(1.0f, 1.0f / 7.0f);  // int8, QSGD with 7 levels
  INFO("n " << n << " block " << block << " mul " << mul);
  const size_t ub = static_cast<size_t>(block), nb = (n + ub - 1) / ub;
  Rng rng(n + ub);
  std::vector<int8_t> q(n);
  for (auto& c : q) c = static_cast<int8_t>(static_cast<int>(rng.below(255)) - 127);
  std::vector<float> scales = random_floats(nb, 11);
  for (auto& s : scales) s = std::fabs(s);
  scales[0] = 0.0f;
  auto dst = random_floats(n, 12);
  const float w = -0.37f;

  auto dq = DeviceArray<int8_t>::from_host(q);
  auto ds = DeviceArray<float>::from_host(scales);
  auto dd = DeviceArray<float>::from_host(dst);
  int8_decode_add(dd.get(), dq.get(), ds.get(), n, block, mul, w, nullptr);
  for (size_t start = 0, b = 0; start < n; start += ub, ++b) {
    const size_t len = std::min(ub, n - start);
    ci::add_i8(std::span<const int8_t>(q).subspan(start, len), scales[b] * mul, dst.data() + start,
               w);
  }
  REQUIRE(same_bits(to_host_synced(dd), dst));
}

// The exact top-k by an independent route: a stable sort by |x| descending (ties keep index
// order), the first k, then increasing.
std::vector<uint32_t> topk_oracle(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST_CASE("top-k selection is exact, ties by lowest index", "[cuda]") {
  STARLING_REQUIRE_GPU();
  TopkSelector selector;  // shared across sizes: scratch grows and is reused
  for (const size_t n : {size_t{70001}, size_t{1}, size_t{2}, size_t{100}, size_t{4099}}) {
    for (const double frac : {0.0, 0.001, 0.01, 0.5, 1.0}) {
      const size_t k = std::clamp<size_t>(static_cast<size_t>(std::ceil(frac * n)), 1, n);
      INFO("n " << n << " k " << k);
      // Half-integers: many equal magnitudes, with both signs, and zeros.
      auto x = random_floats(n, n + k);
      for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;
      const auto want = topk_oracle(x, k);

      auto dx = DeviceArray<float>::from_host(x);
      DeviceArray<uint32_t> idx(k);
      DeviceArray<float> vals(k);
      auto flag = zero_flag();
      selector.select(idx.get(), flag.get(), dx.get(), static_cast<int64_t>(n),
                      static_cast<int64_t>(k), nullptr);
      gather(vals.get(), idx.get(), k, dx.get(), nullptr);
      REQUIRE(to_host_synced(flag)[0] == 0u);
      REQUIRE(idx.to_host() == want);
      std::vector<float> want_vals(k);
      for (size_t j = 0; j < k; ++j) want_vals[j] = x[want[j]];
      REQUIRE(same_bits(vals.to_host(), want_vals));
    }
  }
}

TEST_CASE("top-k selection flags NaN", "[cuda]") {
  STARLING_REQUIRE_GPU();
  auto x = random_floats(5000, 21);
  x[4999] = std::numeric_limits<float>::quiet_NaN();
  auto dx = DeviceArray<float>::from_host(x);
  DeviceArray<uint32_t> idx(50);
  auto flag = zero_flag();
  TopkSelector selector;
  selector.select(idx.get(), flag.get(), dx.get(), 5000, 50, nullptr);
  REQUIRE(to_host_synced(flag)[0] != 0u);
}

TEST_CASE("scatter_add and randk_scatter_add match the CPU decode bit for bit", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const int64_t n = GENERATE(int64_t{1}, int64_t{1000}, int64_t{100003});
  const int64_t k = GENERATE(int64_t{1}, int64_t{37}, int64_t{-1});  // -1: k = n
  const int64_t kk = k < 0 || k > n ? n : k;
  INFO("n " << n << " k " << kk);
  std::vector<uint32_t> idx;
  ci::randk_indices(n, kk, 99, idx);
  const auto vals = random_floats(static_cast<size_t>(kk), 5);
  const auto dst0 = random_floats(static_cast<size_t>(n), 6);
  const float w = 0.3f;

  auto didx = DeviceArray<uint32_t>::from_host(idx);
  auto dvals = DeviceArray<float>::from_host(vals);
  auto d1 = DeviceArray<float>::from_host(dst0), d2 = DeviceArray<float>::from_host(dst0);
  scatter_add(d1.get(), didx.get(), dvals.get(), idx.size(), w, nullptr);
  randk_scatter_add(d2.get(), didx.get(), dvals.get(), n, kk, w, nullptr);

  auto want1 = dst0, want2 = dst0;
  const ci::Strata strata(n, kk);
  for (size_t j = 0; j < idx.size(); ++j) {
    want1[idx[j]] += w * vals[j];
    const float size = static_cast<float>(strata.size(static_cast<int64_t>(j)));
    want2[idx[j]] += w * (vals[j] * size);
  }
  REQUIRE(same_bits(to_host_synced(d1), want1));
  REQUIRE(same_bits(d2.to_host(), want2));
}

TEST_CASE("PowerSGD products through cuBLAS match the CPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [rows, cols, rank] = GENERATE(table<int64_t, int64_t, int>(
      {{2, 3, 1}, {17, 33, 2}, {64, 100, 4}, {300, 257, 8}, {1, 5000, 3}}));
  INFO("rows " << rows << " cols " << cols << " rank " << rank);
  const size_t mn = static_cast<size_t>(rows * cols), pn = static_cast<size_t>(rows * rank),
               qn = static_cast<size_t>(rank * cols);
  const auto m = random_floats(mn, 31), qt = random_floats(qn, 32), p = random_floats(pn, 33);
  // float64 references of P = M Q and Q^T = P^T M.
  std::vector<double> p_ref(pn, 0.0), qt_ref(qn, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int c = 0; c < rank; ++c) {
      for (int64_t j = 0; j < cols; ++j) {
        p_ref[i * rank + c] += double(m[i * cols + j]) * qt[c * cols + j];
        qt_ref[c * cols + j] += double(p[i * rank + c]) * m[i * cols + j];
      }
    }
  }
  auto dm = DeviceArray<float>::from_host(m), dqt = DeviceArray<float>::from_host(qt),
       dp = DeviceArray<float>::from_host(p);
  DeviceArray<float> p_out(pn), qt_out(qn);
  auto cublas = make_cublas();
  powersgd_project(p_out.get(), dm.get(), dqt.get(), rows, cols, rank, cublas.get(), nullptr);
  powersgd_back(qt_out.get(), dm.get(), dp.get(), rows, cols, rank, cublas.get(), nullptr);
  // fp32 sums in cuBLAS's order: within 1e-5 of the largest |value| (as the other GEMM tests).
  require_close(to_host_synced(p_out), p_ref, 1e-5);
  require_close(qt_out.to_host(), qt_ref, 1e-5);
  // The CPU's own products agree with the same references (the oracle is sane).
  std::vector<float> p_cpu(pn), qt_cpu(qn, 0.0f);
  ci::powersgd_project_scalar(m.data(), rows, cols, qt.data(), rank, p_cpu.data());
  ci::powersgd_back_scalar(m.data(), rows, cols, p.data(), rank, qt_cpu.data());
  require_close(p_cpu, p_ref, 1e-5);
  require_close(qt_cpu, qt_ref, 1e-5);

  // decode_add is a kernel in the CPU's order: bit for bit.
  auto dst = random_floats(mn, 34);
  auto ddst = DeviceArray<float>::from_host(dst);
  powersgd_decode_add(ddst.get(), dp.get(), dqt.get(), rows, cols, rank, -0.6f, nullptr);
  ci::powersgd_decode_add_scalar(p.data(), qt.data(), rows, cols, rank, dst.data(), -0.6f);
  REQUIRE(same_bits(to_host_synced(ddst), dst));
}

// A small model-like layout: matrices, a bias, an empty tensor, a vector not a multiple of any
// block.
cc::Layout test_layout() {
  const std::vector<std::pair<std::string, Shape>> tensors = {{"a.weight", {48, 40}},
                                                              {"a.bias", {40}},
                                                              {"b.weight", {100, 37}},
                                                              {"empty", {0}},
                                                              {"c", {1001}}};
  cc::Layout layout;
  int64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    layout.push_back(cc::TensorInfo{name, shape, offset});
    offset += shape_numel(shape);
  }
  return layout;
}

int64_t layout_numel(const cc::Layout& l) { return l.back().offset + shape_numel(l.back().shape); }

// Deltas with ties and zeros, different each round.
std::vector<float> delta_for(int64_t n, int round) {
  auto v = random_floats(static_cast<size_t>(n), 100 + static_cast<uint64_t>(round), 1e-2);
  for (size_t i = 0; i < v.size(); i += 7) v[i] = std::round(v[i] * 400.0f) / 400.0f;
  return v;
}

const std::vector<std::string> kSpecs = {
    "identity",
    "fp16",
    "bf16",
    "int8:block=64",
    "int8:block=7",
    "qsgd:levels=8,bucket=128",
    "topk:ratio=0.05",
    "topk:ratio=0.02,values=int8,block=16",
    "topk:ratio=0.1,values=fp16",
    "topk:ratio=0.1,values=bf16",
    "topk:ratio=0.05,approx=1",
    "randk:ratio=0.1",
    "randk:ratio=0.03,values=int8,block=8",
    "sign",
    "powersgd:rank=2",
    "topk:ratio=0.05;*.bias=identity;b.*=powersgd:rank=3;c=int8:block=100",
    "int8:block=32,ef=1",
    "topk:ratio=0.05,ef=1;*.bias=identity",
    "randk:ratio=0.1,ef=1;c=fp16:ef=1",
};

TEST_CASE("GpuDecoder::decode_add matches compress::decode_add bit for bit", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const std::string spec = GENERATE(from_range(kSpecs));
  INFO(spec);
  const cc::Layout layout = test_layout();
  const int64_t n = layout_numel(layout);
  auto codec = cc::make_codec(spec, layout, 5);
  REQUIRE(codec.ok());
  auto stream = make_stream();
  GpuDecoder decoder(stream.get());
  auto dst = random_floats(static_cast<size_t>(n), 7);
  auto ddst = DeviceArray<float>::from_host(dst);
  settle();
  for (int round = 0; round < 2; ++round) {
    auto upd = (*codec)->encode(delta_for(n, round));
    REQUIRE(upd.ok());
    const float w = round == 0 ? 0.75f : -1.0f;
    REQUIRE(cc::decode_add(*upd, dst, w).ok());
    REQUIRE(decoder.decode_add(*upd, ddst.get(), n, w).ok());
  }
  STARLING_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  REQUIRE(same_bits(ddst.to_host(), dst));
}

// Everything but PowerSGD's factor values, which are compared through their decoded product.
void require_same_structure(const cc::EncodedUpdate& a, const cc::EncodedUpdate& b) {
  REQUIRE(a.numel == b.numel);
  REQUIRE(a.segments.size() == b.segments.size());
  for (size_t i = 0; i < a.segments.size(); ++i) {
    const cc::Segment &x = a.segments[i], &y = b.segments[i];
    INFO("segment " << i);
    REQUIRE(x.codec == y.codec);
    REQUIRE(x.offset == y.offset);
    REQUIRE(x.numel == y.numel);
    REQUIRE(x.shape == y.shape);
    REQUIRE(x.rank == y.rank);
    REQUIRE(x.f32.size() == y.f32.size());
    if (x.codec != cc::CodecKind::kPowerSgd) {
      REQUIRE(cc::serialize_update(cc::EncodedUpdate{x.numel, {x}}) ==
              cc::serialize_update(cc::EncodedUpdate{y.numel, {y}}));
    }
  }
}

TEST_CASE("GpuCodec encodes a layout as the CPU codec does", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const std::string spec = GENERATE(from_range(kSpecs));
  INFO(spec);
  const bool powersgd = spec.find("powersgd") != std::string::npos;
  const cc::Layout layout = test_layout();
  const int64_t n = layout_numel(layout);
  auto cpu = cc::make_codec(spec, layout, 42);
  REQUIRE(cpu.ok());
  auto stream = make_stream();
  auto cublas = make_cublas();
  auto gpu = GpuCodec::make(spec, layout, 42, stream.get(), cublas.get());
  REQUIRE(gpu.ok());
  REQUIRE((*gpu)->numel() == n);
  DeviceArray<float> ddelta(static_cast<size_t>(n));
  cc::EncodedUpdate want, got;  // reused across rounds, as a sender does
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    const auto delta = delta_for(n, round);
    STARLING_CUDA_CHECK(cudaMemcpy(ddelta.get(), delta.data(), delta.size() * sizeof(float),
                                   cudaMemcpyHostToDevice));
    settle();
    REQUIRE((*cpu)->encode_into(delta, want).ok());
    REQUIRE((*gpu)->encode_into(ddelta.get(), got).ok());
    if (!powersgd) {
      REQUIRE(cc::serialize_update(got) == cc::serialize_update(want));
    } else {
      require_same_structure(got, want);
    }
    // Decoded on the CPU: the same values (PowerSGD: within fp32 rounding of the projections,
    // 1e-4 of the largest decoded value after warm-started rounds).
    std::vector<float> y_got(static_cast<size_t>(n)), y_want(static_cast<size_t>(n));
    REQUIRE(cc::decode(got, y_got).ok());
    REQUIRE(cc::decode(want, y_want).ok());
    if (!powersgd) {
      REQUIRE(same_bits(y_got, y_want));
    } else {
      require_close(y_got, std::vector<double>(y_want.begin(), y_want.end()), 1e-4);
    }
    // Error feedback: the device residual is the CPU's, bit for bit.
    const auto state = (*cpu)->persistent_state();
    if (!state.empty()) {
      REQUIRE((*gpu)->residual() != nullptr);
      std::vector<float> r(static_cast<size_t>(n));
      STARLING_CUDA_CHECK(cudaMemcpy(r.data(), (*gpu)->residual(), r.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost));
      REQUIRE(same_bits(r, std::vector<float>(state.begin(), state.end())));
    } else {
      REQUIRE((*gpu)->residual() == nullptr);
    }
  }
}

TEST_CASE("GpuCodec refuses non-finite deltas, naming the tensor", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const std::string spec =
      GENERATE(std::string("int8"), std::string("topk:ratio=0.01"), std::string("randk:ratio=1"),
               std::string("powersgd:rank=2"), std::string("fp16"));
  INFO(spec);
  const cc::Layout layout = test_layout();
  const int64_t n = layout_numel(layout);
  auto delta = delta_for(n, 0);
  delta[static_cast<size_t>(layout[2].offset + 17)] = std::numeric_limits<float>::infinity();
  auto stream = make_stream();
  auto cublas = make_cublas();
  auto gpu = GpuCodec::make(spec, layout, 1, stream.get(), cublas.get());
  REQUIRE(gpu.ok());
  auto ddelta = DeviceArray<float>::from_host(delta);
  settle();
  cc::EncodedUpdate out;
  const Status s = (*gpu)->encode_into(ddelta.get(), out);
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  REQUIRE(s.message().find("b.weight") != std::string::npos);
}

TEST_CASE("GpuDecoder rejects corrupt updates and leaves dst unchanged", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const cc::Layout layout = test_layout();
  const int64_t n = layout_numel(layout);
  // a.weight int8, a.bias identity, b.weight PowerSGD, empty top-k, c random-k.
  auto codec =
      cc::make_codec("int8;*.bias=identity;b.*=powersgd:rank=2;empty=topk;c=randk", layout, 3);
  REQUIRE(codec.ok());
  auto good = (*codec)->encode(delta_for(n, 0));
  REQUIRE(good.ok());
  const auto dst = random_floats(static_cast<size_t>(n), 8);
  auto stream = make_stream();
  GpuDecoder decoder(stream.get());
  auto check = [&](const cc::EncodedUpdate& upd, int64_t dst_numel, StatusCode code) {
    auto ddst = DeviceArray<float>::from_host(dst);
    settle();
    const Status s = decoder.decode_add(upd, ddst.get(), dst_numel, 1.0f);
    INFO(s.to_string());
    REQUIRE(s.code() == code);
    STARLING_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    REQUIRE(same_bits(ddst.to_host(), dst));
  };
  SECTION("destination size") { check(*good, n - 1, StatusCode::kInvalidArgument); }
  SECTION("int8 block count") {
    auto u = *good;
    u.segments[0].scales.pop_back();
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("negative int8 scale") {
    auto u = *good;
    u.segments[0].scales[1] = -1.0f;
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("identity value count (CPU-decoded segment), after device segments") {
    auto u = *good;
    u.segments[1].f32.pop_back();
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("PowerSGD factor size") {
    auto u = *good;
    u.segments[2].f32.pop_back();
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("top-k index out of range") {
    auto u = *good;
    cc::Segment& s = u.segments[4];  // c as top-k
    s.codec = cc::CodecKind::kTopk;
    s.k = 2;
    s.indices = {3, static_cast<uint32_t>(s.numel)};
    s.f32 = {1.0f, 2.0f};
    s.values = cc::ValueCoding::kF32;
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("top-k indices not increasing") {
    auto u = *good;
    cc::Segment& s = u.segments[4];
    s.codec = cc::CodecKind::kTopk;
    s.k = 2;
    s.indices = {5, 5};
    s.f32 = {1.0f, 2.0f};
    s.values = cc::ValueCoding::kF32;
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("random-k with k = 0") {
    auto u = *good;
    u.segments[4].k = 0;
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("segments that do not tile") {
    auto u = *good;
    u.segments[3].offset += 1;
    check(u, n, StatusCode::kDataLoss);
  }
  SECTION("the intact update decodes") {
    auto ddst = DeviceArray<float>::from_host(dst);
    settle();
    REQUIRE(decoder.decode_add(*good, ddst.get(), n, 1.0f).ok());
    auto want = dst;
    REQUIRE(cc::decode_add(*good, want, 1.0f).ok());
    STARLING_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    REQUIRE(same_bits(ddst.to_host(), want));
  }
}

}  // namespace
}  // namespace starling::cuda
