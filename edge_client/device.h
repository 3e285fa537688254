// What an edge client knows of its device: its memory use (Linux /proc), a memory budget it
// stays under, and a condition that says whether it may train now (on AC power, idle, a
// maintenance window...), read from a file or a command the operator chooses.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/util/status.h"

namespace starling::edge_client {

// Resident set size now and its peak (VmRSS, VmHWM of /proc/self/status), in bytes.
// Unavailable where /proc is missing.
Result<uint64_t> current_rss_bytes();
Result<uint64_t> peak_rss_bytes();

// The memory a client may use. limit_bytes 0: no limit.
struct MemoryBudget {
  uint64_t limit_bytes = 0;
  // OK when the process's resident set plus `extra_bytes` (what the next round will allocate)
  // fits the limit; ResourceExhausted naming both figures otherwise.
  Status check(uint64_t extra_bytes, const std::string& what) const;
};

// Whether the client may train now. Both parts are optional and both must allow it:
// - file: training is allowed while this file exists and its first line is not "0" or "no"
//   (e.g. a udev/upower hook writes "1" on AC power and "0" on battery);
// - command: run through /bin/sh -c; exit status 0 allows, any other refuses (e.g.
//   "on_ac_power", or a script checking idleness). Killed after `timeout`.
struct TrainingCondition {
  std::string file;
  std::string command;
  std::chrono::milliseconds timeout{5000};

  bool empty() const { return file.empty() && command.empty(); }
  // True: may train. False: not now (the reason is logged by the caller from `why`).
  // An error only for a condition that cannot be evaluated at all (command not runnable).
  Result<bool> allows(std::string* why = nullptr) const;
};

}  // namespace starling::edge_client
