// Child processes owned by tests (see child_process.h).
#include "tests/testing/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <utility>

namespace starling::testing {
namespace {

using Clock = std::chrono::steady_clock;

// fork + exec of argv with stdout and stderr on `out_fd` (inherited when -1). Between fork and
// exec the child calls only async-signal-safe functions: the argv array is built before.
pid_t start(const std::vector<std::string>& argv, int out_fd) {
  REQUIRE(!argv.empty());
  std::vector<std::string> args = argv;
  std::vector<char*> c_argv;
  for (auto& a : args) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    // Dies with the test process (strictly: with the thread that forked it, the test's main
    // thread); the check after prctl closes the race with a parent that died before it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (out_fd >= 0) {
      dup2(out_fd, STDOUT_FILENO);
      dup2(out_fd, STDERR_FILENO);
    }
    execv(c_argv[0], c_argv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that a kill of the group right after fork finds it
  return pid;
}

}  // namespace

ChildProcess ChildProcess::spawn(const std::vector<std::string>& argv,
                                 const std::filesystem::path& log) {
  int fd = -1;
  if (!log.empty()) {
    fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    INFO("log " << log.string());
    REQUIRE(fd >= 0);
  }
  const pid_t pid = start(argv, fd);
  if (fd >= 0) ::close(fd);
  return ChildProcess(pid);
}

ChildProcess ChildProcess::shell(const std::string& command) {
  return spawn({"/bin/sh", "-c", "exec " + command});
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      exit_code_(other.exit_code_),
      term_signal_(other.term_signal_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    kill();
    pid_ = std::exchange(other.pid_, -1);
    exit_code_ = other.exit_code_;
    term_signal_ = other.term_signal_;
  }
  return *this;
}

ChildProcess::~ChildProcess() { kill(); }

void ChildProcess::reaped(int status) {
  pid_ = -1;
  if (WIFEXITED(status)) {
    exit_code_ = WEXITSTATUS(status);
    term_signal_ = 0;
  } else {
    exit_code_ = -1;
    term_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
}

bool ChildProcess::running() {
  if (pid_ < 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped(status);
    return false;
  }
  return true;
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (running()) {
    if (Clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

int ChildProcess::wait_or_kill(std::chrono::milliseconds timeout) {
  if (auto rc = wait_for(timeout)) return *rc;
  kill();
  return -2;
}

void ChildProcess::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

void ChildProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);  // the group: whatever the child started goes too
  ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  reaped(status);
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  ChildProcess child;
  try {
    child = ChildProcess(start(argv, fds[1]));
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  ::close(fds[1]);
  CommandResult r;
  const auto end = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: every writer (the child and what it started) closed
    r.out.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  const int rc = child.wait_or_kill(std::chrono::milliseconds(std::max<long long>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count())));
  r.rc = rc < 0 ? -1 : rc;
  if (rc == -2) r.out += "\n[killed after the test's timeout]\n";
  return r;
}

CommandResult run_shell(const std::string& command, std::chrono::milliseconds timeout) {
  return run_command({"/bin/sh", "-c", "exec " + command}, timeout);
}

AbortResult run_expecting_abort(const std::function<void()>& f) {
  int fds[2];
  if (pipe(fds) != 0) return {"pipe() failed", false};
  const pid_t pid = fork();
  if (pid < 0) return {"fork() failed", false};
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);
    dup2(fds[1], STDERR_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    f();
    std::_Exit(0);
  }
  close(fds[1]);
  AbortResult r;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) {
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return r;
  r.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  return r;
}

}  // namespace starling::testing
