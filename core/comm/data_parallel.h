// DataParallel: data-parallel training over a Communicator. Gradients are grouped into buckets
// (reverse parameter order) and each bucket is averaged over the ranks as soon as backward has
// finished all of its gradients, on a background thread while backward continues.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/tensor/tensor.h"
#include "core/util/status.h"

namespace starling::comm {

struct DataParallelOptions {
  // Most gradient bytes in one bucket (PyTorch DDP's 25 MB default). A parameter is never split:
  // one larger than the cap gets a bucket of its own.
  size_t bucket_bytes = size_t{25} << 20;
  // true: a ready bucket is all-reduced on a background thread while backward continues.
  // false: every bucket is all-reduced, in order, by finish() on the calling thread.
  bool overlap = true;
  // Copy rank 0's parameter values to every rank when the object is made.
  bool broadcast_parameters = true;
};

// One rank's share of data-parallel training. Every rank of the communicator makes one with the
// same parameter list, then for every step:
//
//   Tensor loss = model.loss(x, y);   // this rank's part of the global batch
//   RETURN_IF_ERROR(dp->backward(loss));  // or autograd::backward(loss, {}, dp->hook()) + finish()
//   opt.step(lr); opt.zero_grad();
//
// After finish() every parameter's grad() holds the mean of the ranks' gradients, bit-identical
// on every rank when the communicator sums in a fixed order (ThreadGroup does), so replicas that
// start equal stay equal. Buckets are launched in their index order on every rank whatever order
// backward reports them in, so the collectives always match across ranks.
//
// Thread-safety: one thread per object (backward and finish on the same thread). Between the
// first gradient of a step and finish() the communicator belongs to this object's worker: the
// caller must not use it then. A parameter that gets no gradient in a step is given a zero one.
// For gradient accumulation, run the earlier micro-batches through plain autograd::backward and
// only the last through this object (like PyTorch's no_sync()).
class DataParallel {
 public:
  // Collective: checks that every rank passed the same parameter names' count, shapes and dtype
  // (f32 only; any mismatch is InvalidArgument on every rank, naming the first differing rank),
  // broadcasts rank 0's values if asked, and assigns buckets. `comm` must outlive the object.
  static Result<std::unique_ptr<DataParallel>> make(
      std::vector<std::pair<std::string, Tensor>> params, Communicator& comm,
      DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Runs autograd::backward(loss) with hook() attached, then finish().
  Status backward(const Tensor& loss);
  // The leaf-gradient hook for autograd::backward. Leaves that are not parameters are ignored.
  void grad_ready(const Tensor& leaf);
  // Starts the buckets not started yet (parameters without a gradient get zeros), waits for all
  // of them and readies the object for the next step. Returns the first error of the step
  // (a collective, or a parameter reported twice), with the bucket named.
  Status finish();

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  // Parameter indices (into the list given to make()) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_params() const;

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<size_t> offsets;  // of each parameter's gradient in `flat`
    std::vector<float> flat;
    size_t pending = 0;  // parameters whose gradient is not final yet in this step
  };

  DataParallel(std::vector<std::pair<std::string, Tensor>> params, Communicator& comm,
               DataParallelOptions options);
  void assign_buckets();
  void mark_ready(size_t param);
  void launch_ready_buckets();
  // Packs, averages and unpacks bucket b (any thread; see the class comment).
  Status reduce_bucket(size_t b);
  void worker_loop();
  void reset_step();

  std::vector<std::pair<std::string, Tensor>> params_;
  Communicator& comm_;
  DataParallelOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;                            // parameter -> bucket
  std::vector<std::pair<const void*, size_t>> param_index_;  // sorted (TensorImpl*, parameter)
  std::vector<Tensor> grads_;                                // this step's gradient per parameter
  std::vector<bool> seen_;
  size_t next_launch_ = 0;
  Status step_error_;  // calling thread's errors in this step

  // Worker (overlap only).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t completed_ = 0;
  bool stop_ = false;
  Status worker_error_;
  std::thread worker_;
};

}  // namespace starling::comm
