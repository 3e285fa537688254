// MPI's side of a simulation over several processes (sim/ranks.h).
#include "sim/ranks.h"

#include <cstdlib>
#include <cstring>

#ifdef STARLING_HAVE_MPI
#include <mpi.h>
#endif

namespace starling::sim {
namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  return std::atoi(v);
}

#ifdef STARLING_HAVE_MPI
// MPI counts are ints: large vectors move in pieces of at most 2^28 elements.
constexpr size_t kPiece = size_t{1} << 28;

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return ok_status();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return internal_error(std::string("MPI ") + what + ": " + std::string(text, len));
}
#endif

}  // namespace

bool Ranks::built_with_mpi() {
#ifdef STARLING_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int Ranks::launched_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    if (const int n = env_int(name); n > 0) return n;
  }
  // srun without an MPI launcher's own variables: Slurm's task count.
  if (std::getenv("PMI_RANK") != nullptr || std::getenv("PMIX_RANK") != nullptr) {
    if (const int n = env_int("SLURM_NTASKS"); n > 0) return n;
  }
  return 1;
}

Result<std::unique_ptr<Ranks>> Ranks::init() {
  const int launched = launched_size();
  if (launched <= 1) return std::unique_ptr<Ranks>(new Ranks(0, 1, false));
#ifdef STARLING_HAVE_MPI
  int provided = 0;
  // Only the main thread calls MPI; the training threads never do.
  RETURN_IF_ERROR(mpi_status(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                             "MPI_Init_thread"));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<Ranks>(new Ranks(rank, size, true));
#else
  return failed_precondition(
      "started by an MPI launcher with " + std::to_string(launched) +
      " ranks, but this starling was built without MPI: install OpenMPI (Debian: "
      "libopenmpi-dev openmpi-bin) and rebuild (CMake finds it; -DSTARLING_MPI=ON insists), or "
      "run `starling simulate` without mpirun");
#endif
}

Ranks::~Ranks() {
#ifdef STARLING_HAVE_MPI
  if (mpi_) MPI_Finalize();
#endif
}

Result<std::vector<std::string>> Ranks::allgather(std::string_view mine) const {
  if (size_ == 1) return std::vector<std::string>{std::string(mine)};
#ifdef STARLING_HAVE_MPI
  if (mine.size() > static_cast<size_t>(INT32_MAX)) {
    return invalid_argument("MPI allgather: more than 2 GiB from one rank");
  }
  const int n = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<size_t>(size_));
  RETURN_IF_ERROR(mpi_status(
      MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD), "allgather"));
  std::vector<int> offsets(static_cast<size_t>(size_));
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[static_cast<size_t>(r)] = static_cast<int>(total);
    total += sizes[static_cast<size_t>(r)];
  }
  if (total > INT32_MAX) return invalid_argument("MPI allgather: more than 2 GiB in all");
  std::string all(static_cast<size_t>(total), '\0');
  RETURN_IF_ERROR(mpi_status(MPI_Allgatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(),
                                            offsets.data(), MPI_BYTE, MPI_COMM_WORLD),
                             "allgatherv"));
  std::vector<std::string> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    out[static_cast<size_t>(r)] = all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                                             static_cast<size_t>(sizes[static_cast<size_t>(r)]));
  }
  return out;
#else
  return failed_precondition("built without MPI");
#endif
}

Status Ranks::sum_to_root([[maybe_unused]] std::span<float> data) const {
  if (size_ == 1) return ok_status();
#ifdef STARLING_HAVE_MPI
  // Point to point, rank by rank: the root adds rank 1's vector, then rank 2's, ..., the same
  // order on every run (MPI_Reduce may combine in any order it likes).
  if (rank_ != 0) {
    for (size_t at = 0; at < data.size(); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, data.size() - at));
      RETURN_IF_ERROR(
          mpi_status(MPI_Send(data.data() + at, n, MPI_FLOAT, 0, 17, MPI_COMM_WORLD), "send"));
    }
    return ok_status();
  }
  std::vector<float> piece(std::min(kPiece, data.size()));
  for (int r = 1; r < size_; ++r) {
    for (size_t at = 0; at < data.size(); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, data.size() - at));
      RETURN_IF_ERROR(
          mpi_status(MPI_Recv(piece.data(), n, MPI_FLOAT, r, 17, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                     "receive"));
      float* d = data.data() + at;
      for (int j = 0; j < n; ++j) d[j] += piece[static_cast<size_t>(j)];
    }
  }
  return ok_status();
#else
  return failed_precondition("built without MPI");
#endif
}

Status Ranks::broadcast([[maybe_unused]] std::span<float> data) const {
  if (size_ == 1) return ok_status();
#ifdef STARLING_HAVE_MPI
  for (size_t at = 0; at < data.size(); at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, data.size() - at));
    RETURN_IF_ERROR(
        mpi_status(MPI_Bcast(data.data() + at, n, MPI_FLOAT, 0, MPI_COMM_WORLD), "broadcast"));
  }
  return ok_status();
#else
  return failed_precondition("built without MPI");
#endif
}

Status Ranks::broadcast([[maybe_unused]] std::string& bytes) const {
  if (size_ == 1) return ok_status();
#ifdef STARLING_HAVE_MPI
  int64_t n = static_cast<int64_t>(bytes.size());
  RETURN_IF_ERROR(mpi_status(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "broadcast"));
  if (n > INT32_MAX) return invalid_argument("MPI broadcast: more than 2 GiB");
  bytes.resize(static_cast<size_t>(n));
  return mpi_status(MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD),
                    "broadcast");
#else
  return failed_precondition("built without MPI");
#endif
}

void Ranks::abort(int code) const {
#ifdef STARLING_HAVE_MPI
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace starling::sim
