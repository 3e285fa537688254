// The ranks of an MPI job that shares one simulation (`mpirun -n R starling simulate`), or one
// process. Each round's selected clients are split over the ranks by client id (client k trains
// on rank k mod R, so its error-feedback residual stays where it was made); every rank folds
// its own clients' updates, and rank 0 adds the partial sums in rank order, applies the
// strategy and broadcasts the new model. The MPI library is an optional build dependency
// (OpenMPI from Debian): without it this still builds, one process is the only group, and
// asking for more is an error that says so.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::sim {

class Ranks {
 public:
  // True when this binary was built with MPI.
  static bool built_with_mpi();
  // The world size an MPI launcher (mpirun / mpiexec: OMPI_COMM_WORLD_SIZE, PMI_SIZE; Slurm's
  // srun: SLURM_NTASKS with PMI) announces in the environment; 1 when none does.
  static int launched_size();
  // The world of this process: MPI_Init when launched_size() > 1 (FailedPrecondition naming the
  // build option when the binary has no MPI), else a group of one. Call once per process.
  static Result<std::unique_ptr<Ranks>> init();
  ~Ranks();  // MPI_Finalize
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  // The rank that trains client k.
  int owner(int client) const { return client % size_; }

  // Every rank's `mine`, in rank order, on every rank.
  Result<std::vector<std::string>> allgather(std::string_view mine) const;
  // Rank 0's `data` becomes the sum of every rank's, added in rank order (rank 0's first), so
  // the result is the same bytes on every run with this many ranks; the others' is unchanged.
  Status sum_to_root(std::span<float> data) const;
  // Rank 0's `data` on every rank.
  Status broadcast(std::span<float> data) const;
  Status broadcast(std::string& bytes) const;
  // Ends the whole job after an error on this rank (the others may be waiting in a collective):
  // MPI_Abort, which the launcher reports with this rank's number. No-op for a group of one.
  [[noreturn]] void abort(int code) const;

 private:
  Ranks(int rank, int size, bool mpi) : rank_(rank), size_(size), mpi_(mpi) {}
  int rank_ = 0;
  int size_ = 1;
  bool mpi_ = false;
};

}  // namespace starling::sim
