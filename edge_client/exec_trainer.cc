// The exec trainer: one child process per round, files in, files out (exec_trainer.h).
#include "edge_client/exec_trainer.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "core/io/safetensors.h"
#include "edge_client/model_params.h"

extern char** environ;

namespace starling::edge_client {
namespace fs = std::filesystem;

namespace {

// The last `lines` lines of a file (at most its last 4 KiB), for error messages.
std::string log_tail(const fs::path& log, int lines = 12) {
  std::ifstream in(log, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string text(static_cast<size_t>(size - from), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t cut = text.size();
  for (int i = 0; i < lines && cut != std::string::npos && cut > 0; ++i) {
    cut = text.rfind('\n', cut - 1);
  }
  if (cut != std::string::npos && cut < text.size()) text = text.substr(cut + 1);
  return text;
}

std::string with_tail(std::string message, const fs::path& log) {
  const std::string tail = log_tail(log);
  if (!tail.empty()) message += "; the end of " + log.string() + ":\n" + tail;
  return message;
}

Result<double> number_field(const nlohmann::json& j, const char* key, const std::string& src) {
  const auto& v = j.at(key);
  if (!v.is_number()) return invalid_argument(src + ": \"" + key + "\" is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) return invalid_argument(src + ": \"" + key + "\" is not finite");
  return d;
}

Result<ExecMetrics> read_metrics(const fs::path& path, bool need_samples) {
  const std::string src = path.string();
  std::ifstream in(path);
  if (!in) return not_found("the trainer wrote no " + src);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(src + ": not JSON: " + e.what());
  }
  if (!j.is_object()) return invalid_argument(src + ": not a JSON object");
  ExecMetrics m;
  if (j.contains("num_samples")) {
    ASSIGN_OR_RETURN(const double n, number_field(j, "num_samples", src));
    if (n < 1 || n != std::floor(n) || n > 9.0e15) {
      return invalid_argument(src + ": \"num_samples\" must be a positive integer");
    }
    m.num_samples = static_cast<uint64_t>(n);
  } else if (need_samples) {
    return invalid_argument(src + ": \"num_samples\" is missing (the update's FedAvg weight)");
  }
  if (j.contains("loss")) {
    ASSIGN_OR_RETURN(m.loss, number_field(j, "loss", src));
    m.has_loss = true;
  }
  if (j.contains("accuracy")) {
    ASSIGN_OR_RETURN(m.accuracy, number_field(j, "accuracy", src));
    m.has_accuracy = true;
  }
  return m;
}

}  // namespace

Result<std::string> resolve_executable(const std::string& name) {
  if (name.empty()) return invalid_argument("trainer_command[0] is empty");
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) != 0) {
      return not_found("trainer_command[0] '" + name + "' is not an executable file");
    }
    return name;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return not_found("trainer_command[0] '" + name + "' is not on PATH");
}

Status run_with_deadline(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         const fs::path& log, std::chrono::milliseconds timeout) {
  if (argv.empty()) return invalid_argument("trainer_command is empty");
  ASSIGN_OR_RETURN(const std::string exe, resolve_executable(argv[0]));
  // Everything the child needs is made here: between fork and exec it may only call
  // async-signal-safe functions.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    bool replaced = false;
    for (const auto& [k, v] : env) replaced |= kv.substr(0, k.size() + 1) == k + "=";
    if (!replaced) env_text.emplace_back(kv);
  }
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) return unavailable("cannot open " + log.string() + ": " + std::strerror(errno));
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int report[2] = {-1, -1};  // the child writes exec's errno here; closed by a successful exec
  if (in < 0 || ::pipe2(report, O_CLOEXEC) != 0) {
    ::close(out);
    if (in >= 0) ::close(in);
    return unavailable("cannot set up the trainer's stdin: " + std::string(std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(out);
    ::close(in);
    ::close(report[0]);
    ::close(report[1]);
    return unavailable("fork failed: " + std::string(std::strerror(err)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execve(exe.c_str(), args.data(), envp.data());
    const int err = errno;
    (void)!::write(report[1], &err, sizeof err);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with the kill below
  ::close(out);
  ::close(in);
  ::close(report[1]);
  int exec_errno = 0;
  ssize_t got = 0;
  do {
    got = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  int status = 0;
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    ::waitpid(pid, &status, 0);
    return unavailable("cannot execute " + exe + ": " + std::strerror(exec_errno));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR)
      return internal_error("waitpid: " + std::string(std::strerror(errno)));
    if (!timed_out && std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      ::kill(-pid, SIGTERM);
      const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (std::chrono::steady_clock::now() < grace && ::waitpid(pid, &status, WNOHANG) == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(-pid, SIGKILL);  // whatever it left running in its group goes with it
  const std::string what = "trainer_command (" + argv[0] + ")";
  if (timed_out) {
    return deadline_exceeded(
        with_tail(what + " did not finish within trainer_timeout_s = " +
                      fmt::format("{:g}", static_cast<double>(timeout.count()) / 1000.0) + " s",
                  log));
  }
  if (WIFSIGNALED(status)) {
    return internal_error(
        with_tail(what + " was killed by signal " + std::to_string(WTERMSIG(status)), log));
  }
  if (WEXITSTATUS(status) != 0) {
    return internal_error(
        with_tail(what + " exited with status " + std::to_string(WEXITSTATUS(status)), log));
  }
  return ok_status();
}

Result<std::unique_ptr<ExecTrainer>> ExecTrainer::create(compress::Layout layout,
                                                         ExecTrainerOptions options) {
  if (options.command.empty()) {
    return invalid_argument("client.trainer_command is empty (e.g. [\"python3\", \"train.py\"])");
  }
  if (options.timeout.count() <= 0) return invalid_argument("trainer timeout must be positive");
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout));
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return unavailable("cannot create " + options.dir.string() + ": " + ec.message());
  if (!options.keep_rounds) {
    // Folders of an earlier run (a restarted client): only the latest round is ever kept.
    for (const auto& entry : fs::directory_iterator(options.dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("round-") || name.starts_with("evaluate-")) {
        std::error_code ignored;
        fs::remove_all(entry.path(), ignored);
      }
    }
  }
  return std::unique_ptr<ExecTrainer>(
      new ExecTrainer(std::move(layout), std::move(options), numel));
}

Result<ExecMetrics> ExecTrainer::run_round(std::span<const float> model, const v1::RoundPlan& plan,
                                           const std::string& mode, std::span<float> output,
                                           bool* is_delta) {
  if (static_cast<int64_t>(model.size()) != numel_) {
    return invalid_argument("a model of " + std::to_string(model.size()) +
                            " elements for a layout of " + std::to_string(numel_));
  }
  const fs::path dir =
      options_.dir / ((mode == "train" ? "round-" : "evaluate-") + std::to_string(plan.round()));
  std::error_code ec;
  if (!options_.keep_rounds && !previous_.empty() && previous_ != dir)
    fs::remove_all(previous_, ec);
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return unavailable("cannot create " + dir.string() + ": " + ec.message());
  previous_ = dir;
  const fs::path global = dir / "global.safetensors";
  const fs::path round_json = dir / "round.json";
  const fs::path update = dir / "update.safetensors";
  const fs::path metrics = dir / "metrics.json";
  const fs::path log = dir / "trainer.log";
  RETURN_IF_ERROR(
      io::save_safetensors(global, layout_tensors(layout_, model),
                           {{"format", "starling-exec"}, {"round", std::to_string(plan.round())}}),
      "writing the trainer's input");
  const nlohmann::json j = {{"protocol", 1},
                            {"mode", mode},
                            {"round", plan.round()},
                            {"model_version", plan.model_version()},
                            {"local_steps", plan.local_steps()},
                            {"batch_size", plan.batch_size()},
                            {"learning_rate", plan.learning_rate()},
                            {"seed", plan.seed()},
                            {"deadline_unix_ms", plan.deadline_unix_ms()},
                            {"node_id", options_.node_id},
                            {"partition", options_.partition},
                            {"num_partitions", options_.num_partitions},
                            {"data_path", options_.data_path}};
  {
    std::ofstream out(round_json);
    out << j.dump(2) << "\n";
    if (!out) return unavailable("cannot write " + round_json.string());
  }
  const std::vector<std::pair<std::string, std::string>> env = {
      {"STARLING_MODE", mode},
      {"STARLING_ROUND_DIR", dir.string()},
      {"STARLING_GLOBAL", global.string()},
      {"STARLING_ROUND_JSON", round_json.string()},
      {"STARLING_OUTPUT", update.string()},
      {"STARLING_METRICS", metrics.string()}};
  RETURN_IF_ERROR(run_with_deadline(options_.command, env, log, options_.timeout));
  ASSIGN_OR_RETURN(ExecMetrics m, read_metrics(metrics, mode == "train"));
  if (mode == "evaluate") return m;
  if (!fs::exists(update)) return not_found("the trainer wrote no " + update.string());
  ASSIGN_OR_RETURN(auto file, io::load_safetensors(update));
  RETURN_IF_ERROR(read_layout_tensors(file, layout_, output, update.string()));
  const auto content = file.metadata.find("starling.content");
  *is_delta = content != file.metadata.end() && content->second == "delta";
  if (content != file.metadata.end() && content->second != "delta" &&
      content->second != "weights") {
    return invalid_argument(update.string() + ": metadata starling.content is '" + content->second +
                            "' (allowed: weights, delta)");
  }
  return m;
}

Result<TrainReport> ExecTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                       std::span<float> delta) {
  bool is_delta = false;
  ASSIGN_OR_RETURN(const ExecMetrics m, run_round(global, plan, "train", delta, &is_delta));
  if (!is_delta) {
    for (size_t i = 0; i < delta.size(); ++i) delta[i] -= global[i];
  }
  TrainReport r;
  r.num_samples = m.num_samples;
  r.loss = static_cast<float>(m.loss);
  spdlog::debug("client {}: exec trainer round {}: {} samples, loss {:.4f}", options_.node_id,
                plan.round(), m.num_samples, m.loss);
  return r;
}

Result<ExecMetrics> ExecTrainer::evaluate(std::span<const float> model, uint64_t round) {
  v1::RoundPlan plan;
  plan.set_round(round);
  bool unused = false;
  ASSIGN_OR_RETURN(ExecMetrics m, run_round(model, plan, "evaluate", {}, &unused));
  if (!m.has_loss) return invalid_argument("the evaluator's metrics.json has no \"loss\"");
  return m;
}

}  // namespace starling::edge_client
