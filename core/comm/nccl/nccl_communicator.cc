// NcclCommunicator: unique-id exchange over a bootstrap Communicator, then NCCL collectives on a
// private stream. NCCL errors and CUDA errors become Statuses (a peer's failure is not a bug).
#include "core/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace starling::comm {

struct NcclCommunicator::State {
  int device = 0;
  std::chrono::milliseconds timeout{60'000};
  bool aborted = false;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float for barrier()
  ~State() {
    // An aborted communicator is already freed.
    if (comm != nullptr && !aborted) ncclCommDestroy(comm);
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

namespace {

Status cuda_status(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return ok_status();
  return unavailable(std::string("nccl: ") + what + ": " + cudaGetErrorString(e));
}

Status nccl_status(const char* what, ncclResult_t r) {
  if (r == ncclSuccess) return ok_status();
  const StatusCode code = r == ncclInvalidArgument || r == ncclInvalidUsage
                              ? StatusCode::kInvalidArgument
                              : StatusCode::kUnavailable;
  return {code, std::string("nccl: ") + what + ": " + ncclGetErrorString(r)};
}

using Clock = std::chrono::steady_clock;

// Polls the non-blocking communicator until its pending operation (init) is no longer in
// progress, or `timeout` passes.
Status wait_comm(ncclComm_t comm, const char* what, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    RETURN_IF_ERROR(nccl_status("ncclCommGetAsyncError", ncclCommGetAsyncError(comm, &async)));
    if (async != ncclInProgress) return nccl_status(what, async);
    if (Clock::now() > end) {
      return deadline_exceeded(std::string("nccl: ") + what + " did not complete within " +
                               std::to_string(timeout.count()) +
                               " ms: a rank of the group is missing or stuck");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(
    Communicator& bootstrap, int device, std::chrono::milliseconds timeout) {
  auto st = std::make_unique<State>();
  st->device = device;
  st->timeout = timeout;
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(device)));

  // The 128-byte id travels as floats through the bootstrap's broadcast (bytes copied verbatim).
  ncclUniqueId id{};
  static_assert(sizeof(id) % sizeof(float) == 0);
  std::vector<float> buf(sizeof(id) / sizeof(float));
  if (bootstrap.rank() == 0) {
    RETURN_IF_ERROR(nccl_status("ncclGetUniqueId", ncclGetUniqueId(&id)));
    std::memcpy(buf.data(), &id, sizeof(id));
  }
  RETURN_IF_ERROR(bootstrap.broadcast(buf, 0), "nccl: unique id exchange");
  std::memcpy(&id, buf.data(), sizeof(id));

  RETURN_IF_ERROR(cuda_status("cudaStreamCreate",
                              cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking)));
  RETURN_IF_ERROR(cuda_status("cudaMalloc", cudaMalloc(&st->scratch, sizeof(float))));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return at once; completion is polled under the deadline
  const ncclResult_t init =
      ncclCommInitRankConfig(&st->comm, bootstrap.size(), id, bootstrap.rank(), &config);
  if (init != ncclSuccess && init != ncclInProgress) {
    return nccl_status("ncclCommInitRankConfig", init);
  }
  if (const Status joined = wait_comm(st->comm, "ncclCommInitRankConfig", timeout); !joined.ok()) {
    ncclCommAbort(st->comm);
    st->aborted = true;
    return joined.with_context("rank " + std::to_string(bootstrap.rank()) + " of " +
                               std::to_string(bootstrap.size()));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(bootstrap.rank(), bootstrap.size(), std::move(st)));
}

NcclCommunicator::NcclCommunicator(int rank, int size, std::unique_ptr<State> state)
    : rank_(rank), size_(size), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

Status NcclCommunicator::finish(const char* what, int nccl_result) {
  auto fail = [&](Status st) {
    if (!state_->aborted) {
      ncclCommAbort(state_->comm);  // frees the communicator; peers' collectives error out too
      state_->aborted = true;
    }
    broken_ = st.with_context("rank " + std::to_string(rank_) + " of " + std::to_string(size_));
    return broken_;
  };
  const auto r = static_cast<ncclResult_t>(nccl_result);
  if (r != ncclSuccess && r != ncclInProgress) return fail(nccl_status(what, r));
  // Enqueued (a non-blocking communicator may still be launching: ncclInProgress). Wait for
  // the stream under the deadline, watching the communicator's asynchronous errors.
  const auto end = Clock::now() + state_->timeout;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(state_->comm, &async);
    if (q != ncclSuccess) return fail(nccl_status("ncclCommGetAsyncError", q));
    if (async != ncclSuccess && async != ncclInProgress) return fail(nccl_status(what, async));
    if (async == ncclSuccess) {
      const cudaError_t e = cudaStreamQuery(state_->stream);
      if (e == cudaSuccess) return ok_status();
      if (e != cudaErrorNotReady) return fail(cuda_status(what, e));
    }
    if (Clock::now() > end) {
      return fail(deadline_exceeded(std::string("nccl: ") + what + " did not complete within " +
                                    std::to_string(state_->timeout.count()) +
                                    " ms: a rank of the group is missing or stuck"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Status NcclCommunicator::all_reduce(std::span<float> data, ReduceOp op) {
  if (!broken_.ok()) return broken_;
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("ncclAllReduce", ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat,
                                               op == ReduceOp::kSum ? ncclSum : ncclAvg,
                                               state_->comm, state_->stream));
}

Status NcclCommunicator::broadcast(std::span<float> data, int root) {
  if (!broken_.ok()) return broken_;
  if (root < 0 || root >= size_) return invalid_argument("nccl: broadcast root out of range");
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("ncclBroadcast", ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat,
                                               root, state_->comm, state_->stream));
}

Status NcclCommunicator::all_gather(std::span<const float> in, std::span<float> out) {
  if (!broken_.ok()) return broken_;
  if (out.size() != in.size() * static_cast<size_t>(size_)) {
    return invalid_argument("nccl: all_gather output holds " + std::to_string(out.size()) +
                            " elements, needs " + std::to_string(in.size() * size_));
  }
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("ncclAllGather", ncclAllGather(in.data(), out.data(), in.size(), ncclFloat,
                                               state_->comm, state_->stream));
}

Status NcclCommunicator::barrier() {
  if (!broken_.ok()) return broken_;
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("barrier", ncclAllReduce(state_->scratch, state_->scratch, 1, ncclFloat, ncclSum,
                                         state_->comm, state_->stream));
}

}  // namespace starling::comm
