// Child processes owned by a test: a ChildProcess kills (SIGKILL to its process group) and reaps
// its child when it goes out of scope, whether the test passed, failed a REQUIRE or threw, and
// the child dies with the test process too (PR_SET_PDEATHSIG), so a test runner killed mid-test
// leaves no server behind. Every test process also runs in a temporary folder of its own
// (catch_main.cc points TMPDIR there and removes it at exit).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace starling::testing {

struct CommandResult {
  int rc = -1;      // exit code; -1 when killed by a signal or by the timeout
  std::string out;  // stdout and stderr together
};

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv, stdout and stderr appended to `log` (inherited when
  // empty), in a process group of its own. Fails the test (REQUIRE) when it cannot start.
  static ChildProcess spawn(const std::vector<std::string>& argv,
                            const std::filesystem::path& log = {});
  // `/bin/sh -c "exec COMMAND"`: one process (the shell becomes COMMAND), so the pid is the
  // program's own; COMMAND may carry redirections.
  static ChildProcess shell(const std::string& command);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();  // kill() unless already reaped

  pid_t pid() const { return pid_; }
  // True until the child has been reaped (by wait_for, kill or running()).
  bool running();
  // Waits up to `timeout` for the child to exit. Its exit code; -1 when a signal ended it
  // (term_signal() tells which); nullopt when it is still running after `timeout`.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  // Like wait_for, but a child still running after `timeout` is killed: then -2.
  int wait_or_kill(std::chrono::milliseconds timeout);
  int term_signal() const { return term_signal_; }
  void signal(int sig) const;  // to the child alone
  // SIGKILL to the child's process group, then reaps it. No-op once reaped.
  void kill();

 private:
  friend CommandResult run_command(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds timeout);
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  void reaped(int status);

  pid_t pid_ = -1;
  int exit_code_ = 0;
  int term_signal_ = 0;
};

// Runs argv to completion (or `timeout`, after which it is killed), capturing its output; the
// child is owned as a ChildProcess while it runs.
CommandResult run_command(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::minutes(10));
// The same through `/bin/sh -c "exec COMMAND"`.
CommandResult run_shell(const std::string& command,
                        std::chrono::milliseconds timeout = std::chrono::minutes(10));

#ifdef STARLING_BINARY_DIR
// For the tests that drive the built `starling` binary (STARLING_BINARY_DIR is defined for every
// test target): its path, a command run to completion at --log-level warn, and a child whose
// stdout and stderr go to `log`.
inline const std::string& starling_binary() {
  static const std::string path = std::string(STARLING_BINARY_DIR) + "/apps/starling";
  return path;
}
inline CommandResult run_starling(const std::string& args) {
  return run_shell(starling_binary() + " --log-level warn " + args);
}
inline ChildProcess spawn_starling(const std::string& args, const std::filesystem::path& log) {
  return ChildProcess::shell(starling_binary() + " " + args + " >" + log.string() + " 2>&1");
}
#endif

// Runs f in a forked child with its stdout and stderr captured: what it wrote, and whether it
// died of SIGABRT (death tests of code that aborts with a reason; Catch's handlers are not
// installed in the child).
struct AbortResult {
  std::string output;
  bool aborted = false;
};
AbortResult run_expecting_abort(const std::function<void()>& f);

}  // namespace starling::testing
