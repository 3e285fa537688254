// Communicator: the collectives that data-parallel training needs (all-reduce, broadcast,
// all-gather, barrier), independent of the transport underneath (threads here, NCCL on GPUs).
#pragma once

#include <span>

#include "core/util/status.h"

namespace starling::comm {

enum class ReduceOp { kSum, kAvg };

// One rank's handle on a group of `size()` ranks. Every rank of the group must call the same
// collectives in the same order with the same element counts; a mismatch is reported as an
// error on every rank (never a hang), and a rank that never arrives makes the others fail with
// DeadlineExceeded once the group's timeout passes. After any error the group is broken and
// every later collective fails fast.
//
// Memory: spans are host memory for CPU communicators and device memory for NCCL ones (the
// span is only a pointer and a length; it is never dereferenced on the host there).
// Thread-safety: one thread per handle; distinct handles may be used concurrently.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] becomes the sum (or sum / size()) of data[i] over the ranks, summed in
  // rank order 0, 1, ..., size()-1 by the CPU implementation, so results are bit-identical on
  // every rank and every run.
  virtual Status all_reduce(std::span<float> data, ReduceOp op) = 0;
  // data on every rank becomes data of rank `root`.
  virtual Status broadcast(std::span<float> data, int root) = 0;
  // out = concatenation of every rank's `in`, in rank order. REQUIRES: out.size() ==
  // size() * in.size() (checked: InvalidArgument otherwise).
  virtual Status all_gather(std::span<const float> in, std::span<float> out) = 0;
  // Returns once every rank has called barrier().
  virtual Status barrier() = 0;
};

}  // namespace starling::comm
