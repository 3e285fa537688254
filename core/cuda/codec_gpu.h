// The device-side entry points of the update codecs: GpuCodec encodes a flat device delta into
// the same compress::EncodedUpdate as the CPU codec (the wire format is unchanged) and GpuDecoder
// folds one into a device buffer. Kernels in codec_kernels.h. CUDA builds only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/cuda/codec_kernels.h"
#include "core/cuda/handles.h"
#include "core/util/status.h"

namespace starling::cuda {

// decode_add of an EncodedUpdate into a device buffer: dst[i] = dst[i] + weight * decoded[i],
// bit-identical to compress::decode_add on the host. int8, QSGD, top-k, random-k and PowerSGD
// segments run as kernels; the others (identity, fp16, bf16, sign) go through the CPU decoder on
// a host copy of their part of dst. Every segment is validated (the checks of
// compress::decode_add) before dst is written: on error dst is unchanged. Keeps device scratch
// between calls; one stream. Thread-compatible.
class GpuDecoder {
 public:
  explicit GpuDecoder(cudaStream_t stream) : stream_(stream) {}
  // REQUIRES: dst holds dst_numel floats on the current device, else (size mismatch)
  // InvalidArgument. Returns once the additions are enqueued and the host arrays may be freed.
  Status decode_add(const compress::EncodedUpdate& update, float* dst, int64_t dst_numel,
                    float weight);

 private:
  cudaStream_t stream_;
  DeviceArray<int8_t> i8_;
  DeviceArray<float> f32_, scales_;
  DeviceArray<uint32_t> idx_;
};

// One-off form of GpuDecoder::decode_add (allocates its scratch per call).
Status decode_add_device(const compress::EncodedUpdate& update, float* dst, int64_t dst_numel,
                         float weight, cudaStream_t stream);

// The device-side sender: encodes a flat device delta of `layout` into the EncodedUpdate that
// compress::make_codec(spec, layout, seed) would produce from the same values on the host.
// int8 and exact top-k (any value coding) are bit-identical; random-k is bit-identical (same
// seeds and indices, from the same per-tensor random streams); PowerSGD matches within float
// rounding (cuBLAS sums in another order), with its warm start Q kept on the device. Other
// codecs (identity, fp16, bf16, QSGD, sign, DGC's approximate top-k) copy their tensor to the
// host and run the CPU encoder there, bit-identical by construction. With ef=1 the residual is
// kept on the device (ErrorFeedback's arithmetic). Thread-compatible; one stream.
class GpuCodec {
 public:
  // stream and cublas must outlive the codec; cublas is set to `stream` on each use.
  static Result<std::unique_ptr<GpuCodec>> make(const compress::CompressionSpec& spec,
                                                compress::Layout layout, uint64_t seed,
                                                cudaStream_t stream, cublasHandle_t cublas);
  static Result<std::unique_ptr<GpuCodec>> make(std::string_view spec, compress::Layout layout,
                                                uint64_t seed, cudaStream_t stream,
                                                cublasHandle_t cublas);
  ~GpuCodec();
  GpuCodec(const GpuCodec&) = delete;
  GpuCodec& operator=(const GpuCodec&) = delete;

  // delta: numel() floats on the device, read on `stream`. Fills `out` (reusing its arrays) and
  // returns after the stream has caught up (out is complete on the host). Non-finite values are
  // InvalidArgument naming the tensor, as compress::Codec::encode_into.
  Status encode_into(const float* delta, compress::EncodedUpdate& out);
  const compress::Layout& layout() const;
  int64_t numel() const;
  // The error-feedback residual on the device (numel() floats), or null without ef.
  const float* residual() const;
  // compress::Codec's persistent_state / restore_state: the residual copied to / from the host
  // (empty without ef). A state of the wrong size or with a non-finite value is InvalidArgument,
  // and the residual is then unchanged.
  std::vector<float> persistent_state() const;
  Status restore_state(std::span<const float> state);

  struct Impl;

 private:
  explicit GpuCodec(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::cuda
