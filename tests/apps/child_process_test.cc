// The fixture that owns the processes tests start: a child is killed and reaped when its owner
// goes (a passed test, a failed REQUIRE, an exception), dies with a test process that is itself
// killed, and a command that outlives its timeout is killed; each test process has its own
// TMPDIR.
#include "tests/testing/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

using starling::testing::ChildProcess;
using namespace std::chrono_literals;

namespace {

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

}  // namespace

TEST_CASE("child process: killed and reaped when its owner goes, even on an exception", "[apps]") {
  pid_t pid = -1;
  try {
    ChildProcess child = ChildProcess::spawn({"/bin/sleep", "60"});
    pid = child.pid();
    REQUIRE(alive(pid));
    throw std::runtime_error("a failing test");
  } catch (const std::runtime_error&) {
  }
  REQUIRE(pid > 0);
  // Reaped, not a zombie: the pid is gone, and it is no longer our child.
  CHECK_FALSE(alive(pid));
  int status = 0;
  CHECK(waitpid(pid, &status, WNOHANG) == -1);
}

TEST_CASE("child process: exit codes, signals and the timeout", "[apps]") {
  ChildProcess ok = ChildProcess::shell("true");
  CHECK(ok.wait_for(10s) == 0);
  ChildProcess three = ChildProcess::shell("sh -c 'exit 3'");
  CHECK(three.wait_for(10s) == 3);
  ChildProcess slow = ChildProcess::spawn({"/bin/sleep", "60"});
  CHECK_FALSE(slow.wait_for(50ms).has_value());
  CHECK(slow.running());
  slow.signal(SIGTERM);
  CHECK(slow.wait_for(10s) == -1);
  CHECK(slow.term_signal() == SIGTERM);
  ChildProcess stuck = ChildProcess::spawn({"/bin/sleep", "60"});
  CHECK(stuck.wait_or_kill(50ms) == -2);
  CHECK_FALSE(stuck.running());

  const auto out =
      starling::testing::run_command({"/bin/sh", "-c", "echo out; echo err >&2; exit 4"});
  CHECK(out.rc == 4);
  CHECK(out.out == "out\nerr\n");
  // A command past its timeout is killed with what it started (its process group).
  const auto start = std::chrono::steady_clock::now();
  const auto late = starling::testing::run_command({"/bin/sh", "-c", "sleep 60 & sleep 60"}, 200ms);
  CHECK(late.rc == -1);
  CHECK(std::chrono::steady_clock::now() - start < 20s);
}

TEST_CASE("child process: dies with the test process that started it", "[apps]") {
  // Orphans come back to this process instead of init, so the test can reap the grandchild.
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t middle = fork();
  REQUIRE(middle >= 0);
  if (middle == 0) {  // a test process that starts a server and is then killed
    ChildProcess server = ChildProcess::spawn({"/bin/sleep", "60"});
    const pid_t p = server.pid();
    // Once it runs sleep, its parent-death signal is armed (set before exec).
    const std::string cmdline = "/proc/" + std::to_string(p) + "/cmdline";
    for (int i = 0; i < 500; ++i) {
      std::ifstream f(cmdline);
      std::string argv0;
      std::getline(f, argv0, '\0');
      if (argv0 == "/bin/sleep") break;
      usleep(10000);
    }
    if (write(fds[1], &p, sizeof p) != sizeof p) std::_Exit(2);
    ::kill(getpid(), SIGKILL);  // no destructor runs
  }
  close(fds[1]);
  pid_t server = -1;
  REQUIRE(read(fds[0], &server, sizeof server) == sizeof server);
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(middle, &status, 0) == middle);
  CHECK(WTERMSIG(status) == SIGKILL);
  // The server was reparented to this process and killed by its parent-death signal.
  pid_t r = 0;
  for (int i = 0; i < 500 && r == 0; ++i) {
    r = waitpid(server, &status, WNOHANG);
    if (r == 0) usleep(10000);
  }
  if (r == 0) ::kill(server, SIGKILL);
  REQUIRE(r == server);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_CASE("child process: each test process has a temporary folder of its own", "[apps]") {
  const char* tmp = std::getenv("TMPDIR");
  REQUIRE(tmp != nullptr);
  const std::filesystem::path own = tmp;
  CHECK(own.filename().string().rfind("starling_test.", 0) == 0);
  CHECK(std::filesystem::is_directory(own));
  CHECK(std::filesystem::temp_directory_path() == own);
  // Children see it too.
  CHECK(starling::testing::run_shell("printf %s \"$TMPDIR\"").out == own.string());
}

TEST_CASE("the end-of-suite check names a process and a folder the suite left behind", "[apps]") {
  const std::string script = std::string(STARLING_SOURCE_DIR) + "/scripts/check_leftovers.sh";
  const std::string id = "check-test-" + std::to_string(getpid());
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "suite";
  std::filesystem::create_directories(tmp);
  const std::string check =
      "env STARLING_LEFTOVER_GRACE_S=0 bash " + script + " " + id + " " + tmp.string();
  auto clean = starling::testing::run_shell(check);
  INFO(clean.out);
  CHECK(clean.rc == 0);

  ChildProcess server =
      ChildProcess::spawn({"/usr/bin/env", "STARLING_TEST_SUITE=" + id, "/bin/sleep", "60"});
  std::filesystem::create_directories(tmp / "starling_test.left");
  auto dirty = starling::testing::run_shell(check);
  INFO(dirty.out);
  CHECK(dirty.rc == 1);
  CHECK_THAT(dirty.out, Catch::Contains("pid " + std::to_string(server.pid())));
  CHECK_THAT(dirty.out, Catch::Contains("sleep 60"));
  CHECK_THAT(dirty.out, Catch::Contains((tmp / "starling_test.left").string()));
  // The check kills what it names.
  CHECK(server.wait_for(10s) == -1);
  CHECK(server.term_signal() == SIGKILL);
}
