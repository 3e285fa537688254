// NcclCommunicator: unique-id exchange over a bootstrap Communicator, then NCCL collectives on a
// private stream. NCCL errors and CUDA errors become Statuses (a peer's failure is not a bug).
#include "core/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

namespace starling::comm {

struct NcclCommunicator::State {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float for barrier()
  ~State() {
    if (comm != nullptr) ncclCommDestroy(comm);
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

}  // namespace

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(Communicator& bootstrap,
                                                                   int device) {
  auto st = std::make_unique<State>();
  st->device = device;
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
  RETURN_IF_ERROR(nccl_status("ncclCommInitRank",
                              ncclCommInitRank(&st->comm, bootstrap.size(), id, bootstrap.rank())));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(bootstrap.rank(), bootstrap.size(), std::move(st)));
}

NcclCommunicator::NcclCommunicator(int rank, int size, std::unique_ptr<State> state)
    : rank_(rank), size_(size), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

Status NcclCommunicator::finish(const char* what, int nccl_result) {
  RETURN_IF_ERROR(nccl_status(what, static_cast<ncclResult_t>(nccl_result)));
  return cuda_status(what, cudaStreamSynchronize(state_->stream));
}

Status NcclCommunicator::all_reduce(std::span<float> data, ReduceOp op) {
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("ncclAllReduce", ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat,
                                               op == ReduceOp::kSum ? ncclSum : ncclAvg,
                                               state_->comm, state_->stream));
}

Status NcclCommunicator::broadcast(std::span<float> data, int root) {
  if (root < 0 || root >= size_) return invalid_argument("nccl: broadcast root out of range");
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("ncclBroadcast", ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat,
                                               root, state_->comm, state_->stream));
}

Status NcclCommunicator::all_gather(std::span<const float> in, std::span<float> out) {
  if (out.size() != in.size() * static_cast<size_t>(size_)) {
    return invalid_argument("nccl: all_gather output holds " + std::to_string(out.size()) +
                            " elements, needs " + std::to_string(in.size() * size_));
  }
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("ncclAllGather", ncclAllGather(in.data(), out.data(), in.size(), ncclFloat,
                                               state_->comm, state_->stream));
}

Status NcclCommunicator::barrier() {
  RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(state_->device)));
  return finish("barrier", ncclAllReduce(state_->scratch, state_->scratch, 1, ncclFloat, ncclSum,
                                         state_->comm, state_->stream));
}

}  // namespace starling::comm
