// Host side of the CUDA update codecs: GpuDecoder and GpuCodec (codec_gpu.h) drive the kernels
// of codec_cuda.cu and reuse core/compress's CPU code for seeds, indices, value codings and the
// codecs that stay on the CPU. CUDA builds only (empty otherwise).
#if defined(STARLING_WITH_CUDA)
#include "core/cuda/codec_gpu.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

// The CPU oracles (randk_indices, TensorEncoder, encode_values, powersgd_applies) are private to
// core/compress; this file is that library's CUDA backend, and calling the same functions is
// what keeps the indices, seeds and fallbacks identical to the CPU's.
#include "core/compress/internal/kernels.h"
#include "core/cuda/check.h"

namespace starling::cuda {

namespace cc = ::starling::compress;
namespace ci = ::starling::compress::internal;

namespace {

template <typename T>
void ensure(DeviceArray<T>& a, size_t n) {
  if (a.size() < n) a = DeviceArray<T>(n);
}

template <typename T>
void upload(T* dst, const T* src, size_t n, cudaStream_t stream) {
  // From pageable memory: returns once `src` is staged, so the caller may free it.
  if (n > 0) {
    STARLING_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
}

template <typename T>
void download(T* dst, const T* src, size_t n, cudaStream_t stream) {
  if (n > 0) {
    STARLING_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  }
}

void sync(cudaStream_t stream) { STARLING_CUDA_CHECK(cudaStreamSynchronize(stream)); }

// The checks of compress::decode_add (core/compress/decode.cc) for the codecs decoded here by
// kernels; the others are checked by the CPU decoder itself. Same conditions, same messages.
Status bad(const cc::Segment& s, size_t index, const std::string& what) {
  return data_loss("segment " + std::to_string(index) + " (" +
                   std::string(cc::codec_kind_name(s.codec)) + "): " + what);
}

bool all_finite_nonneg(const std::vector<float>& v) {
  for (float f : v) {
    if (!(f >= 0.0f && f <= 3.4028235e38f)) return false;
  }
  return true;
}

size_t blocks_of(int64_t n, int32_t block) { return static_cast<size_t>((n + block - 1) / block); }

Status check_values(const cc::Segment& s, size_t index, int64_t k) {
  const size_t uk = static_cast<size_t>(k);
  switch (s.values) {
    case cc::ValueCoding::kF32:
      if (s.f32.size() != uk) return bad(s, index, "expected " + std::to_string(k) + " values");
      return ok_status();
    case cc::ValueCoding::kF16:
    case cc::ValueCoding::kBf16:
      if (s.u16.size() != uk) return bad(s, index, "expected " + std::to_string(k) + " values");
      return ok_status();
    case cc::ValueCoding::kInt8:
      if (s.block < 1) return bad(s, index, "int8 values need block >= 1");
      if (s.i8.size() != uk || s.scales.size() != blocks_of(k, s.block)) {
        return bad(s, index, "int8 values: code or scale count does not match k");
      }
      if (!all_finite_nonneg(s.scales)) return bad(s, index, "non-finite or negative scale");
      return ok_status();
  }
  return bad(s, index, "unknown value coding");
}

// True for the codecs GpuDecoder decodes with kernels.
bool device_decoded(cc::CodecKind kind) {
  return kind == cc::CodecKind::kInt8 || kind == cc::CodecKind::kQsgd ||
         kind == cc::CodecKind::kTopk || kind == cc::CodecKind::kRandk ||
         kind == cc::CodecKind::kPowerSgd;
}

Status check_device_segment(const cc::Segment& s, size_t index) {
  const int64_t n = s.numel;
  const size_t un = static_cast<size_t>(n);
  switch (s.codec) {
    case cc::CodecKind::kInt8:
      if (s.block < 1) return bad(s, index, "block must be >= 1");
      if (s.i8.size() != un) return bad(s, index, "code count does not match numel");
      if (s.scales.size() != blocks_of(n, s.block)) return bad(s, index, "wrong block count");
      if (!all_finite_nonneg(s.scales)) return bad(s, index, "non-finite or negative scale");
      return ok_status();
    case cc::CodecKind::kQsgd: {
      if (s.block < 1) return bad(s, index, "bucket must be >= 1");
      if (s.levels < 1 || s.levels > 127) return bad(s, index, "levels must be in [1, 127]");
      if (s.i8.size() != un) return bad(s, index, "code count does not match numel");
      if (s.scales.size() != blocks_of(n, s.block)) return bad(s, index, "wrong bucket count");
      if (!all_finite_nonneg(s.scales)) return bad(s, index, "non-finite or negative norm");
      const int lim = s.levels;
      for (int8_t c : s.i8) {
        if (c > lim || c < -lim) return bad(s, index, "code outside [-levels, levels]");
      }
      return ok_status();
    }
    case cc::CodecKind::kTopk: {
      if (s.k < 0 || s.k > n) return bad(s, index, "k outside [0, numel]");
      if (s.indices.size() != static_cast<size_t>(s.k)) {
        return bad(s, index, "index count does not match k");
      }
      int64_t prev = -1;
      for (uint32_t i : s.indices) {
        if (static_cast<int64_t>(i) <= prev || static_cast<int64_t>(i) >= n) {
          return bad(s, index, "indices must increase strictly and stay below numel");
        }
        prev = i;
      }
      return check_values(s, index, s.k);
    }
    case cc::CodecKind::kRandk:
      if (s.k < 0 || s.k > n || (s.k == 0 && n > 0)) return bad(s, index, "k outside [1, numel]");
      return check_values(s, index, s.k);
    case cc::CodecKind::kPowerSgd: {
      int64_t prod = 1;
      for (int64_t d : s.shape) {
        if (d < 0 || __builtin_mul_overflow(prod, d, &prod)) return bad(s, index, "bad shape");
      }
      if (prod != n) return bad(s, index, "shape does not match numel");
      if (s.rank < 1 || s.rank > 1024) return bad(s, index, "rank must be in [1, 1024]");
      int64_t rows = 0, cols = 0;
      if (!ci::powersgd_applies(s.shape, s.rank, &rows, &cols)) {
        return bad(s, index, "shape and rank do not describe a low-rank matrix");
      }
      const size_t want = static_cast<size_t>(s.rank) * static_cast<size_t>(rows + cols);
      if (s.f32.size() != want) return bad(s, index, "factor sizes do not match shape and rank");
      return ok_status();
    }
    default:
      return bad(s, index, "not decoded on the device");
  }
}

// The kept values of a validated sparse segment as floats, decoded as compress::decode_add
// decodes them (value_at in decode.cc).
void sparse_values(const cc::Segment& s, std::vector<float>& out) {
  const size_t k = static_cast<size_t>(s.k);
  out.resize(k);
  switch (s.values) {
    case cc::ValueCoding::kF32:
      std::copy(s.f32.begin(), s.f32.begin() + static_cast<std::ptrdiff_t>(k), out.begin());
      return;
    case cc::ValueCoding::kF16:
      for (size_t j = 0; j < k; ++j) out[j] = ci::half_to_float(s.u16[j]);
      return;
    case cc::ValueCoding::kBf16:
      for (size_t j = 0; j < k; ++j) out[j] = ci::bf16_bits_to_float(s.u16[j]);
      return;
    case cc::ValueCoding::kInt8: {
      const size_t b = static_cast<size_t>(s.block);
      for (size_t j = 0; j < k; ++j) out[j] = static_cast<float>(s.i8[j]) * s.scales[j / b];
      return;
    }
  }
}

// core/compress/encode.cc's keep count: ceil(ratio * n), clamped to [1, n] (0 for n == 0).
int64_t keep_count(int64_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, n);
}

// PowerSGD's orthonormalization, as core/compress/powersgd.cc does it (modified Gram-Schmidt in
// double on the host; P is small and goes to the host anyway as part of the payload).
void orthonormalize(float* p, int64_t rows, int rank) {
  std::vector<double> col(static_cast<size_t>(rows));
  std::vector<double> basis(static_cast<size_t>(rows * rank), 0.0);
  for (int c = 0; c < rank; ++c) {
    double before = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      col[static_cast<size_t>(i)] = p[i * rank + c];
      before += col[static_cast<size_t>(i)] * col[static_cast<size_t>(i)];
    }
    for (int b = 0; b < c; ++b) {
      const double* q = &basis[static_cast<size_t>(b * rows)];
      double dot = 0.0;
      for (int64_t i = 0; i < rows; ++i) dot += q[i] * col[static_cast<size_t>(i)];
      for (int64_t i = 0; i < rows; ++i) col[static_cast<size_t>(i)] -= dot * q[i];
    }
    double norm = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      norm += col[static_cast<size_t>(i)] * col[static_cast<size_t>(i)];
    }
    norm = std::sqrt(norm);
    const bool keep = norm > 1e-6 * std::sqrt(before) && norm > 1e-30;
    double* q = &basis[static_cast<size_t>(c * rows)];
    for (int64_t i = 0; i < rows; ++i) {
      q[i] = keep ? col[static_cast<size_t>(i)] / norm : 0.0;
      p[i * rank + c] = static_cast<float>(q[i]);
    }
  }
}

// compress::internal::TensorEncoder::encode's reset of a segment's fields: arrays this codec
// fills keep their size (no zero fill before being overwritten), the others are emptied.
void reset_segment(cc::Segment& seg, const cc::CodecSpec& spec, const cc::TensorInfo& info,
                   int64_t n) {
  seg.block = seg.levels = seg.rank = 0;
  seg.k = 0;
  seg.seed = 0;
  seg.values = cc::ValueCoding::kF32;
  const cc::CodecKind kind = spec.kind;
  const bool sparse = kind == cc::CodecKind::kTopk || kind == cc::CodecKind::kRandk;
  const cc::ValueCoding vc = spec.values;
  if (!(kind == cc::CodecKind::kPowerSgd || (sparse && vc == cc::ValueCoding::kF32))) {
    seg.f32.clear();
  }
  if (!(sparse && (vc == cc::ValueCoding::kF16 || vc == cc::ValueCoding::kBf16))) seg.u16.clear();
  const bool int8_values = sparse && vc == cc::ValueCoding::kInt8;
  if (!(kind == cc::CodecKind::kInt8 || int8_values)) seg.i8.clear();
  if (!(kind == cc::CodecKind::kInt8 || int8_values)) seg.scales.clear();
  if (kind != cc::CodecKind::kTopk) seg.indices.clear();
  seg.bits.clear();
  seg.offset = info.offset;
  seg.numel = n;
  seg.shape = info.shape;
  seg.codec = kind;
}

Status nonfinite_error() { return invalid_argument("non-finite value in the update"); }

}  // namespace

// ---- GpuDecoder ----

Status GpuDecoder::decode_add(const cc::EncodedUpdate& update, float* dst, int64_t dst_numel,
                              float weight) {
  if (update.numel < 0 || update.numel != dst_numel) {
    return invalid_argument("decode_add: update has " + std::to_string(update.numel) +
                            " elements, destination " + std::to_string(dst_numel));
  }
  // Pass 1: validate everything, and run the CPU decoder on host copies of the segments it
  // handles, before any write to dst.
  struct HostPart {
    int64_t offset = 0;
    std::vector<float> values;
  };
  std::vector<HostPart> host_parts;
  size_t max_i8 = 0, max_f32 = 0, max_scales = 0, max_idx = 0;
  int64_t next = 0;
  for (size_t i = 0; i < update.segments.size(); ++i) {
    const cc::Segment& s = update.segments[i];
    if (s.offset != next || s.numel < 0 || s.numel > update.numel - next) {
      return bad(s, i, "segments must tile [0, numel) in order").with_context("decode_add");
    }
    next += s.numel;
    if (device_decoded(s.codec)) {
      RETURN_IF_ERROR(check_device_segment(s, i), "decode_add");
      max_i8 = std::max(max_i8, s.i8.size());
      max_scales = std::max(max_scales, s.scales.size());
      max_f32 = std::max({max_f32, s.f32.size(), static_cast<size_t>(std::max<int64_t>(s.k, 0))});
      max_idx = std::max(max_idx, static_cast<size_t>(std::max<int64_t>(s.k, 0)));
      continue;
    }
    // Identity, fp16, bf16, sign: one pass over the elements, as cheap on the host as the copies
    // to reach the device; decoded by compress::decode_add into a copy of dst's part.
    cc::EncodedUpdate one;
    one.numel = s.numel;
    one.segments.push_back(s);
    one.segments.back().offset = 0;
    HostPart part{s.offset, std::vector<float>(static_cast<size_t>(s.numel))};
    download(part.values.data(), dst + s.offset, part.values.size(), stream_);
    sync(stream_);
    RETURN_IF_ERROR(cc::decode_add(one, part.values, weight),
                    "decode_add: segment " + std::to_string(i));
    host_parts.push_back(std::move(part));
  }
  if (next != update.numel) {
    return data_loss("decode_add: segments cover " + std::to_string(next) + " of " +
                     std::to_string(update.numel) + " elements");
  }
  // Pass 2: the writes.
  ensure(i8_, max_i8);
  ensure(f32_, max_f32);
  ensure(scales_, max_scales);
  ensure(idx_, max_idx);
  std::vector<float> values;
  std::vector<uint32_t> idx;
  for (const cc::Segment& s : update.segments) {
    float* d = dst + s.offset;
    switch (s.codec) {
      case cc::CodecKind::kInt8:
      case cc::CodecKind::kQsgd: {
        const float mul =
            s.codec == cc::CodecKind::kQsgd ? 1.0f / static_cast<float>(s.levels) : 1.0f;
        upload(i8_.get(), s.i8.data(), s.i8.size(), stream_);
        upload(scales_.get(), s.scales.data(), s.scales.size(), stream_);
        int8_decode_add(d, i8_.get(), scales_.get(), s.i8.size(), s.block, mul, weight, stream_);
        break;
      }
      case cc::CodecKind::kTopk:
        sparse_values(s, values);
        upload(f32_.get(), values.data(), values.size(), stream_);
        upload(idx_.get(), s.indices.data(), s.indices.size(), stream_);
        scatter_add(d, idx_.get(), f32_.get(), s.indices.size(), weight, stream_);
        break;
      case cc::CodecKind::kRandk:
        if (s.k == 0) break;  // an empty tensor: nothing sampled
        sparse_values(s, values);
        ci::randk_indices(s.numel, s.k, s.seed, idx);
        upload(f32_.get(), values.data(), values.size(), stream_);
        upload(idx_.get(), idx.data(), idx.size(), stream_);
        randk_scatter_add(d, idx_.get(), f32_.get(), s.numel, s.k, weight, stream_);
        break;
      case cc::CodecKind::kPowerSgd: {
        const int64_t rows = s.shape[0], cols = s.numel / rows;
        upload(f32_.get(), s.f32.data(), s.f32.size(), stream_);
        powersgd_decode_add(d, f32_.get(), f32_.get() + rows * s.rank, rows, cols, s.rank, weight,
                            stream_);
        break;
      }
      default:
        break;
    }
  }
  for (const HostPart& part : host_parts) {
    upload(dst + part.offset, part.values.data(), part.values.size(), stream_);
  }
  return ok_status();
}

Status decode_add_device(const cc::EncodedUpdate& update, float* dst, int64_t dst_numel,
                         float weight, cudaStream_t stream) {
  GpuDecoder decoder(stream);
  Status s = decoder.decode_add(update, dst, dst_numel, weight);
  // The decoder's scratch is freed on return: let the enqueued kernels finish with it first.
  sync(stream);
  return s;
}

// ---- GpuCodec ----

namespace {

enum class Path { kInt8, kTopk, kRandk, kPowerSgd, kHost };

struct TensorState {
  TensorState(cc::TensorInfo info_, const cc::CodecSpec& spec_, Rng rng_)
      : info(std::move(info_)),
        spec(spec_),
        n(shape_numel(info.shape)),
        host(spec_, info, rng_),
        rng(rng_) {}
  cc::TensorInfo info;
  cc::CodecSpec spec;
  int64_t n = 0;
  Path path = Path::kHost;
  ci::TensorEncoder host;  // kHost: the CPU encoder, on the CPU codec's random stream
  Rng rng;                 // kRandk, kPowerSgd: the same stream
  int64_t rows = 0, cols = 0;
  DeviceArray<float> q;  // PowerSGD warm start Q^T: (rank, cols)
  bool q_ready = false;
};

}  // namespace

struct GpuCodec::Impl {
  cc::Layout layout;
  int64_t numel = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<TensorState> tensors;
  bool any_ef = false;
  std::vector<uint8_t> mask;
  DeviceArray<float> residual, corrected;
  GpuDecoder decoder{nullptr};
  TopkSelector topk;
  DeviceArray<unsigned> flag;
  DeviceArray<int8_t> q8;
  DeviceArray<float> f32a, f32b;
  DeviceArray<uint32_t> idx;
  std::vector<float> host_x, host_vals;
  std::vector<uint32_t> host_idx;

  Status encode_tensor(TensorState& t, const float* x, cc::Segment& seg);
  Status encode_all(const float* delta, cc::EncodedUpdate& out);
};

Status GpuCodec::Impl::encode_tensor(TensorState& t, const float* x, cc::Segment& seg) {
  const int64_t n = t.n;
  const size_t un = static_cast<size_t>(n);
  if (t.path == Path::kHost) {
    host_x.resize(un);
    download(host_x.data(), x, un, stream);
    sync(stream);
    return t.host.encode(host_x, seg);
  }
  reset_segment(seg, t.spec, t.info, n);
  STARLING_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(unsigned), stream));
  unsigned flag_host = 0;
  switch (t.path) {
    case Path::kInt8: {
      const size_t b = static_cast<size_t>(t.spec.block);
      seg.block = t.spec.block;
      seg.i8.resize(un);
      seg.scales.resize((un + b - 1) / b);
      int8_encode(q8.get(), f32a.get(), flag.get(), x, un, t.spec.block, stream);
      download(seg.i8.data(), q8.get(), un, stream);
      download(seg.scales.data(), f32a.get(), seg.scales.size(), stream);
      download(&flag_host, flag.get(), 1, stream);
      sync(stream);
      return flag_host != 0 ? nonfinite_error() : ok_status();
    }
    case Path::kTopk: {
      const int64_t k = keep_count(n, t.spec.ratio);
      const size_t uk = static_cast<size_t>(k);
      topk.select(idx.get(), flag.get(), x, n, k, stream);
      gather(f32a.get(), idx.get(), uk, x, stream);
      seg.indices.resize(uk);
      host_vals.resize(uk);
      download(seg.indices.data(), idx.get(), uk, stream);
      download(host_vals.data(), f32a.get(), uk, stream);
      download(&flag_host, flag.get(), 1, stream);
      sync(stream);
      if (flag_host != 0) return nonfinite_error();
      seg.k = k;
      ci::encode_values(host_vals, t.spec.values, t.spec.block, seg);
      return ok_status();
    }
    case Path::kRandk: {
      const int64_t k = keep_count(n, t.spec.ratio);
      const size_t uk = static_cast<size_t>(k);
      seg.k = k;
      seg.seed = t.rng.next_u64();
      ci::randk_indices(n, k, seg.seed, host_idx);
      upload(idx.get(), host_idx.data(), uk, stream);
      gather(f32a.get(), idx.get(), uk, x, stream);
      host_vals.resize(uk);
      download(host_vals.data(), f32a.get(), uk, stream);
      sync(stream);
      if (ci::has_nonfinite(host_vals)) return nonfinite_error();
      ci::encode_values(host_vals, t.spec.values, t.spec.block, seg);
      return ok_status();
    }
    case Path::kPowerSgd: {
      const int r = t.spec.rank;
      const int64_t rows = t.rows, cols = t.cols;
      const size_t qn = static_cast<size_t>(r * cols), pn = static_cast<size_t>(rows * r);
      if (!t.q_ready) {
        std::vector<float> q0(qn);
        for (auto& v : q0) v = static_cast<float>(t.rng.normal());
        upload(t.q.get(), q0.data(), qn, stream);
        sync(stream);
        t.q_ready = true;
      }
      seg.rank = r;
      seg.f32.resize(pn + qn);
      float* p = seg.f32.data();
      float* qt = p + pn;
      float* p_dev = f32a.get();
      float* qt_dev = f32b.get();
      powersgd_project(p_dev, x, t.q.get(), rows, cols, r, cublas, stream);
      download(p, p_dev, pn, stream);
      sync(stream);
      if (ci::has_nonfinite(std::span<const float>(p, pn))) {
        return invalid_argument("non-finite value in the update (or PowerSGD overflow)");
      }
      orthonormalize(p, rows, r);
      upload(p_dev, p, pn, stream);
      powersgd_back(qt_dev, x, p_dev, rows, cols, r, cublas, stream);
      download(qt, qt_dev, qn, stream);
      sync(stream);
      if (ci::has_nonfinite(std::span<const float>(qt, qn))) {
        return invalid_argument("PowerSGD overflow in Q = M^T P");
      }
      // Warm start; a factor that vanished restarts from a random direction (as the CPU).
      STARLING_CUDA_CHECK(
          cudaMemcpyAsync(t.q.get(), qt_dev, qn * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      std::vector<float> fresh;
      for (int c = 0; c < r; ++c) {
        const float* qc = qt + c * cols;
        if (!std::all_of(qc, qc + cols, [](float v) { return v == 0.0f; })) continue;
        fresh.resize(static_cast<size_t>(cols));
        for (auto& v : fresh) v = static_cast<float>(t.rng.normal());
        upload(t.q.get() + c * cols, fresh.data(), fresh.size(), stream);
      }
      sync(stream);
      return ok_status();
    }
    case Path::kHost:
      break;
  }
  return internal_error("unhandled codec path");
}

Status GpuCodec::Impl::encode_all(const float* delta, cc::EncodedUpdate& out) {
  out.numel = numel;
  out.segments.resize(layout.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorState& t = tensors[i];
    RETURN_IF_ERROR(encode_tensor(t, delta + t.info.offset, out.segments[i]),
                    "encode '" + t.info.name + "'");
  }
  return ok_status();
}

GpuCodec::GpuCodec(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuCodec::~GpuCodec() = default;

Result<std::unique_ptr<GpuCodec>> GpuCodec::make(const cc::CompressionSpec& spec, cc::Layout layout,
                                                 uint64_t seed, cudaStream_t stream,
                                                 cublasHandle_t cublas) {
  ASSIGN_OR_RETURN(const int64_t numel, cc::validate_layout(layout), "GpuCodec");
  auto impl = std::make_unique<Impl>();
  impl->numel = numel;
  impl->stream = stream;
  impl->cublas = cublas;
  impl->decoder = GpuDecoder(stream);
  // The CPU codec's streams: make_codec forks tensor t's from Rng(seed).
  const Rng root(seed);
  size_t max_n = 0, max_a = 1, max_b = 1, max_idx = 1;
  int64_t max_topk = 0;
  impl->tensors.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const cc::CodecSpec& s = spec.spec_for(layout[t].name);
    RETURN_IF_ERROR(cc::validate_codec_spec(s), "GpuCodec: tensor '" + layout[t].name + "'");
    TensorState st(layout[t], s, root.fork(t));
    const int64_t n = st.n;
    if (n > 0) {
      switch (s.kind) {
        case cc::CodecKind::kInt8:
          st.path = Path::kInt8;
          break;
        case cc::CodecKind::kTopk:
          if (!s.approx) st.path = Path::kTopk;
          break;
        case cc::CodecKind::kRandk:
          st.path = Path::kRandk;
          break;
        case cc::CodecKind::kPowerSgd:
          if (ci::powersgd_applies(layout[t].shape, s.rank, &st.rows, &st.cols)) {
            st.path = Path::kPowerSgd;
          }
          break;
        default:
          // Identity, fp16, bf16, QSGD (a sequential random stream), sign and DGC's sampled
          // top-k: the CPU encoder on a host copy of the tensor.
          break;
      }
    }
    const size_t un = static_cast<size_t>(n);
    switch (st.path) {
      case Path::kInt8:
        max_n = std::max(max_n, un);
        max_a =
            std::max(max_a, (un + static_cast<size_t>(s.block) - 1) / static_cast<size_t>(s.block));
        break;
      case Path::kTopk:
      case Path::kRandk:
        max_a = std::max(max_a, un);
        max_idx = std::max(max_idx, un);
        if (st.path == Path::kTopk) max_topk = std::max(max_topk, n);
        break;
      case Path::kPowerSgd:
        max_a = std::max(max_a, static_cast<size_t>(st.rows * s.rank));
        max_b = std::max(max_b, static_cast<size_t>(st.cols * s.rank));
        st.q = DeviceArray<float>(static_cast<size_t>(st.cols * s.rank));
        break;
      case Path::kHost:
        break;
    }
    impl->mask.push_back(s.error_feedback ? 1 : 0);
    impl->any_ef = impl->any_ef || s.error_feedback;
    impl->tensors.push_back(std::move(st));
  }
  impl->flag = DeviceArray<unsigned>(1);
  impl->q8 = DeviceArray<int8_t>(std::max<size_t>(max_n, 1));
  impl->f32a = DeviceArray<float>(max_a);
  impl->f32b = DeviceArray<float>(max_b);
  impl->idx = DeviceArray<uint32_t>(max_idx);
  impl->layout = std::move(layout);
  if (impl->any_ef) {
    const size_t un = static_cast<size_t>(numel);
    impl->residual = DeviceArray<float>(un);
    impl->corrected = DeviceArray<float>(un);
    if (un > 0) {
      STARLING_CUDA_CHECK(cudaMemsetAsync(impl->residual.get(), 0, un * sizeof(float), stream));
    }
  }
  impl->topk.reserve(max_topk, stream);  // now rather than in the first round
  STARLING_CUDA_CHECK(cudaStreamSynchronize(stream));
  return std::unique_ptr<GpuCodec>(new GpuCodec(std::move(impl)));
}

Result<std::unique_ptr<GpuCodec>> GpuCodec::make(std::string_view spec, cc::Layout layout,
                                                 uint64_t seed, cudaStream_t stream,
                                                 cublasHandle_t cublas) {
  ASSIGN_OR_RETURN(cc::CompressionSpec cs, cc::parse_compression_spec(spec));
  return make(cs, std::move(layout), seed, stream, cublas);
}

Status GpuCodec::encode_into(const float* delta, cc::EncodedUpdate& out) {
  Impl& m = *impl_;
  if (!m.any_ef) return m.encode_all(delta, out);
  // compress::ErrorFeedback's arithmetic: corrected = delta + residual; residual = corrected +
  // (-1) * decoded, through the decoder that matches compress::decode_add bit for bit.
  const size_t un = static_cast<size_t>(m.numel);
  add_vectors(m.corrected.get(), delta, m.residual.get(), un, m.stream);
  RETURN_IF_ERROR(m.encode_all(m.corrected.get(), out), "error feedback");
  RETURN_IF_ERROR(m.decoder.decode_add(out, m.corrected.get(), m.numel, -1.0f), "error feedback");
  std::swap(m.residual, m.corrected);
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    if (m.mask[t] || m.tensors[t].n == 0) continue;
    STARLING_CUDA_CHECK(cudaMemsetAsync(m.residual.get() + m.tensors[t].info.offset, 0,
                                        static_cast<size_t>(m.tensors[t].n) * sizeof(float),
                                        m.stream));
  }
  sync(m.stream);
  return ok_status();
}

const cc::Layout& GpuCodec::layout() const { return impl_->layout; }
int64_t GpuCodec::numel() const { return impl_->numel; }
const float* GpuCodec::residual() const { return impl_->any_ef ? impl_->residual.get() : nullptr; }

std::vector<float> GpuCodec::persistent_state() const {
  const Impl& m = *impl_;
  if (!m.any_ef || m.numel == 0) return {};
  std::vector<float> out(static_cast<size_t>(m.numel));
  STARLING_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.residual.get(), out.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost, m.stream));
  sync(m.stream);
  return out;
}

Status GpuCodec::restore_state(std::span<const float> state) {
  Impl& m = *impl_;
  if (!m.any_ef) {
    if (state.empty()) return ok_status();
    return invalid_argument("this codec keeps no state, but " + std::to_string(state.size()) +
                            " values were given to restore");
  }
  if (state.size() != static_cast<size_t>(m.numel)) {
    return invalid_argument("error feedback: saved residual has " + std::to_string(state.size()) +
                            " elements, the layout " + std::to_string(m.numel));
  }
  for (size_t i = 0; i < state.size(); ++i) {
    if (!std::isfinite(state[i])) {
      return invalid_argument("error feedback: saved residual element " + std::to_string(i) +
                              " is not finite");
    }
  }
  if (!state.empty()) {
    STARLING_CUDA_CHECK(cudaMemcpyAsync(m.residual.get(), state.data(), state.size_bytes(),
                                        cudaMemcpyHostToDevice, m.stream));
    sync(m.stream);
  }
  return ok_status();
}

}  // namespace starling::cuda
#endif  // STARLING_WITH_CUDA
