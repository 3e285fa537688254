// run_ranks: runs one function per rank of a ThreadGroup, each on its own thread, so that an
// error on any rank stops every other rank (as a Status) instead of leaving it waiting.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "core/comm/communicator.h"
#include "core/util/status.h"

namespace starling::comm {

// Makes a ThreadGroup of `n` ranks (collective timeout `timeout`), runs fn(comm) for each rank
// on its own thread and returns each rank's Status once all have returned. When a rank returns
// an error the group is aborted with that error, so the others fail fast with it as context.
// REQUIRES: n >= 1.
std::vector<Status> run_ranks(int n, std::chrono::milliseconds timeout,
                              const std::function<Status(Communicator& comm)>& fn);

// The error that stopped the run: the first rank's own failure, preferred over the
// consequences it caused on other ranks (Cancelled by abort, DeadlineExceeded); OK if none.
Status first_error(const std::vector<Status>& statuses);

}  // namespace starling::comm
