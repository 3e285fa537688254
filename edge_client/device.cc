// Memory figures from /proc and the training condition.
#include "edge_client/device.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string_view>
#include <thread>

extern char** environ;

namespace starling::edge_client {
namespace {

// A "Key:   123 kB" line of /proc/self/status, in bytes.
Result<uint64_t> proc_status_kb(std::string_view key) {
  std::ifstream in("/proc/self/status");
  if (!in) return unavailable("/proc/self/status is not readable");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 &&
        line[key.size()] == ':') {
      const uint64_t kb = std::stoull(line.substr(key.size() + 1));
      return kb * 1024;
    }
  }
  return unavailable("no " + std::string(key) + " in /proc/self/status");
}

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 19)) >> 20) + " MiB"; }

}  // namespace

Result<uint64_t> current_rss_bytes() { return proc_status_kb("VmRSS"); }
Result<uint64_t> peak_rss_bytes() { return proc_status_kb("VmHWM"); }

Status MemoryBudget::check(uint64_t extra_bytes, const std::string& what) const {
  if (limit_bytes == 0) return ok_status();
  ASSIGN_OR_RETURN(const uint64_t rss, current_rss_bytes());
  if (rss + extra_bytes > limit_bytes) {
    return Status(StatusCode::kResourceExhausted,
                  what + " needs about " + mib(extra_bytes) + " on top of the " + mib(rss) +
                      " in use, over the memory limit of " + mib(limit_bytes) +
                      " ([client].memory_limit_mb)");
  }
  return ok_status();
}

Result<bool> TrainingCondition::allows(std::string* why) const {
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) {
      if (why) *why = "condition file " + file + " does not exist";
      return false;
    }
    std::string first;
    std::getline(in, first);
    while (!first.empty() && (first.back() == ' ' || first.back() == '\r')) first.pop_back();
    if (first == "0" || first == "no") {
      if (why) *why = "condition file " + file + " says '" + first + "'";
      return false;
    }
  }
  if (!command.empty()) {
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    // In a process group of its own, so that a timeout kills what the shell started too.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char**>(argv), environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      return unavailable("condition command '" + command + "' could not start (errno " +
                         std::to_string(rc) + ")");
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0) return unavailable("condition command '" + command + "': waitpid failed");
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        if (why) *why = "condition command '" + command + "' timed out";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (why) {
        *why = "condition command '" + command + "' exited with " +
               (WIFEXITED(status) ? std::to_string(WEXITSTATUS(status)) : std::string("a signal"));
      }
      return false;
    }
  }
  return true;
}

}  // namespace starling::edge_client
