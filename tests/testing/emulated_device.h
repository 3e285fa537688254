// A GPU stand-in for machines without one. While an EmulatedDevice lives, DeviceType::kCUDA has
// a DeviceBackend whose memory is host memory out of reach of CPU kernels (Tensor::data() refuses
// it, as it refuses GPU memory) and a DeviceOps table that runs each op's CPU form on host copies
// of its inputs, recording a backward that does the same for the gradients. Results and
// gradients are therefore bit-identical to a CPU run: a model, trainer or optimizer driven on
// this device checks the routing (parameters, batches, optimizer state and gradients kept on the
// device, every op taking its device form), and the CUDA table's own kernels are checked against
// the CPU by the [cuda] parity tests. Not for a build's real CUDA tests: it replaces the kCUDA
// backend for its lifetime (and restores the previous one after).
#pragma once

#include <cstddef>
#include <memory>

#include "core/tensor/tensor.h"

namespace starling::testing {

class EmulatedDevice {
 public:
  EmulatedDevice();
  ~EmulatedDevice();
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;

  static Device device() { return Device::cuda(0); }
  // Bytes allocated on the device now, and how many op calls took their device form.
  size_t live_bytes() const;
  size_t op_calls() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace starling::testing
