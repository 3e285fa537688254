// The exec trainer's protocol (edge_client/exec_trainer.h): the files a round's program gets
// and must leave, and every way a program can fail: crash, hang past the deadline, missing or
// extra or misshapen or non-finite tensors, bad metrics, a command that is not there. Trainers
// here are shell scripts (the protocol needs nothing else) and Python scripts on the standard
// library (examples/exec_protocol/starling_exec.py).
#include "edge_client/exec_trainer.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("starling_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A two-tensor model: w [2, 3] and b [3].
compress::Layout layout() { return {{"w", {2, 3}, 0}, {"b", {3}, 6}}; }
std::vector<float> model() { return {1, 2, 3, 4, 5, 6, -1, 0.5f, 0.25f}; }

fs::path script(const fs::path& dir, const std::string& name, const std::string& body) {
  const fs::path p = dir / name;
  std::ofstream(p) << body;
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

// A Python trainer on starling_exec: `body` runs with `t` (the global tensors) and `rnd`.
fs::path python_trainer(const fs::path& dir, const std::string& name, const std::string& body) {
  return script(dir, name,
                "import sys\nsys.path.insert(0, '" + std::string(STARLING_SOURCE_DIR) +
                    "/examples/exec_protocol')\nimport starling_exec as se\n"
                    "rnd = se.round_info()\nt = se.read_global()\n" +
                    body);
}

ExecTrainerOptions options(const fs::path& dir, std::vector<std::string> command) {
  ExecTrainerOptions o;
  o.command = std::move(command);
  o.dir = dir / "rounds";
  o.timeout = std::chrono::seconds(20);
  o.node_id = "client-7";
  o.partition = 2;
  o.num_partitions = 5;
  o.data_path = "/data/mine";
  return o;
}

v1::RoundPlan plan(uint64_t round) {
  v1::RoundPlan p;
  p.set_round(round);
  p.set_model_version(round - 1);
  p.set_local_steps(7);
  p.set_batch_size(16);
  p.set_learning_rate(0.125f);
  p.set_seed(99);
  return p;
}

Status train_once(ExecTrainer& t, std::vector<float>* delta, uint64_t round = 1) {
  delta->assign(9, 0.0f);
  auto r = t.train(model(), plan(round), *delta);
  return r.status();
}

TEST_CASE("exec trainer: a shell script that hands back the global model gives a zero update",
          "[edge_client]") {
  const fs::path d = temp_dir("exec_shell");
  // Keeps what it was given, for the checks below.
  const auto sh =
      script(d, "same.sh",
             "#!/bin/sh\nset -e\ncp \"$STARLING_GLOBAL\" \"$STARLING_OUTPUT\"\n"
             "cp \"$STARLING_ROUND_JSON\" \"" +
                 (d / "seen.json").string() +
                 "\"\necho \"$STARLING_MODE $STARLING_ROUND_DIR\" > \"" + (d / "env.txt").string() +
                 "\"\necho '{\"num_samples\": 40, \"loss\": 1.5}' > "
                 "\"$STARLING_METRICS\"\necho trained\n");
  auto t = ExecTrainer::create(layout(), options(d, {sh.string()}));
  REQUIRE(t.ok());
  CHECK((*t)->round_failures_recoverable());
  std::vector<float> delta(9, 1.0f);
  auto r = (*t)->train(model(), plan(3), delta);
  REQUIRE(r.ok());
  CHECK(r->num_samples == 40);
  CHECK(r->loss == 1.5f);
  CHECK(delta == std::vector<float>(9, 0.0f));
  // round.json carries the plan and who the client is.
  std::ifstream in(d / "seen.json");
  const auto j = nlohmann::json::parse(in);
  CHECK(j.at("protocol") == 1);
  CHECK(j.at("mode") == "train");
  CHECK(j.at("round") == 3);
  CHECK(j.at("local_steps") == 7);
  CHECK(j.at("batch_size") == 16);
  CHECK(j.at("learning_rate") == 0.125);
  CHECK(j.at("seed") == 99);
  CHECK(j.at("node_id") == "client-7");
  CHECK(j.at("partition") == 2);
  CHECK(j.at("num_partitions") == 5);
  CHECK(j.at("data_path") == "/data/mine");
  std::string mode, dir;
  std::ifstream(d / "env.txt") >> mode >> dir;
  CHECK(mode == "train");
  CHECK(dir == (d / "rounds" / "round-3").string());
  // The global model as the program saw it: the federation's names and shapes.
  auto g = io::load_safetensors(d / "rounds" / "round-3" / "global.safetensors");
  REQUIRE(g.ok());
  REQUIRE(g->tensors.size() == 2);
  CHECK(g->tensors[0].first == "w");
  CHECK(g->tensors[0].second.shape() == Shape{2, 3});
  CHECK(g->tensors[1].second.to_float_vector() == std::vector<float>{-1, 0.5f, 0.25f});
  // Its output went to the round's log; the next round replaces the folder of this one.
  std::ifstream log(d / "rounds" / "round-3" / "trainer.log");
  std::string line;
  std::getline(log, line);
  CHECK(line == "trained");
  REQUIRE(train_once(**t, &delta, 4).ok());
  CHECK(!fs::exists(d / "rounds" / "round-3"));
  CHECK(fs::exists(d / "rounds" / "round-4"));
}

TEST_CASE("exec trainer: new weights or an update, in any float dtype, give local - global",
          "[edge_client]") {
  const fs::path d = temp_dir("exec_python");
  // New weights: 2 * global + 1 (exact in f32).
  const auto weights =
      python_trainer(d, "weights.py",
                     "out = {k: (s, [2 * x + 1 for x in v]) for k, (s, v) in t.items()}\n"
                     "se.write_output(out)\nse.write_metrics(num_samples=12, loss=0.5)\n");
  auto t = ExecTrainer::create(layout(), options(d, {"python3", weights.string()}));
  REQUIRE(t.ok());
  std::vector<float> delta;
  REQUIRE(train_once(**t, &delta).ok());
  const auto g = model();
  for (size_t i = 0; i < g.size(); ++i) CHECK(delta[i] == (2 * g[i] + 1) - g[i]);
  // An update, marked as such.
  const auto update =
      python_trainer(d, "delta.py",
                     "out = {k: (s, [0.25] * len(v)) for k, (s, v) in t.items()}\n"
                     "se.write_output(out, delta=True)\nse.write_metrics(num_samples=3)\n");
  auto u = ExecTrainer::create(layout(), options(d, {"python3", update.string()}));
  REQUIRE(u.ok());
  REQUIRE(train_once(**u, &delta).ok());
  CHECK(delta == std::vector<float>(9, 0.25f));
  // f64 and bf16 tensors are converted (bf16: 1.5 and -2 are exact).
  io::StateDict sd;
  sd.emplace_back("w", Tensor::full({2, 3}, 1.5, DType::kF64));
  sd.emplace_back("b", Tensor::full({3}, -2.0, DType::kBF16));
  REQUIRE(io::save_safetensors(d / "mixed.safetensors", sd).ok());
  const auto mixed = script(d, "mixed.sh",
                            "#!/bin/sh\ncp " + (d / "mixed.safetensors").string() +
                                " \"$STARLING_OUTPUT\"\necho '{\"num_samples\": 1}' > "
                                "\"$STARLING_METRICS\"\n");
  auto m = ExecTrainer::create(layout(), options(d, {mixed.string()}));
  REQUIRE(m.ok());
  REQUIRE(train_once(**m, &delta).ok());
  for (size_t i = 0; i < 6; ++i) CHECK(delta[i] == 1.5f - g[i]);
  for (size_t i = 6; i < 9; ++i) CHECK(delta[i] == -2.0f - g[i]);
}

TEST_CASE("exec trainer: a crash, a hang or bad tensors cost the round, with the reason",
          "[edge_client]") {
  const fs::path d = temp_dir("exec_fail");
  auto failure = [&](const std::string& name, const std::string& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto o = options(d, {"python3", python_trainer(d, name, body).string()});
    o.timeout = timeout;
    auto t = ExecTrainer::create(layout(), o);
    REQUIRE(t.ok());
    std::vector<float> delta;
    return train_once(**t, &delta);
  };
  const std::string good_metrics = "se.write_metrics(num_samples=1, loss=0.1)\n";
  SECTION("a crash: the exit status and the end of its output") {
    const Status st =
        failure("crash.py", "print('out of memory on the device', file=sys.stderr)\nsys.exit(3)\n");
    CHECK(st.code() == StatusCode::kInternal);
    CHECK_THAT(st.message(), Catch::Contains("exited with status 3") &&
                                 Catch::Contains("out of memory on the device") &&
                                 Catch::Contains("trainer.log"));
  }
  SECTION("killed by a signal") {
    const Status st =
        failure("segv.py", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n");
    CHECK_THAT(st.message(), Catch::Contains("killed by signal 11"));
  }
  SECTION("a hang: killed at the deadline, with whatever it started") {
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = failure("hang.py",
                              "import subprocess, time\n"
                              "subprocess.Popen(['sleep', '300'])\n"
                              "print('waiting for the GPU', flush=True)\ntime.sleep(300)\n",
                              std::chrono::milliseconds(1500));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(st.code() == StatusCode::kDeadlineExceeded);
    CHECK_THAT(st.message(), Catch::Contains("did not finish within trainer_timeout_s = 1.5 s") &&
                                 Catch::Contains("waiting for the GPU"));
    CHECK(s < 10);
    // Ignoring SIGTERM does not help: SIGKILL follows.
    const Status stubborn =
        failure("stubborn.py",
                "import signal, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)\n",
                std::chrono::milliseconds(500));
    CHECK(stubborn.code() == StatusCode::kDeadlineExceeded);
  }
  SECTION("tensors: missing, extra, misshapen, not float, not finite") {
    CHECK_THAT(failure("missing.py", "se.write_output({'w': t['w']})\n" + good_metrics).message(),
               Catch::Contains("tensor 'b' is missing"));
    CHECK_THAT(failure("extra.py", "t['head'] = ([1], [0.0])\nse.write_output(t)\n" + good_metrics)
                   .message(),
               Catch::Contains("tensor 'head' is not in the federation's model"));
    CHECK_THAT(
        failure("shape.py", "t['w'] = ([3, 2], t['w'][1])\nse.write_output(t)\n" + good_metrics)
            .message(),
        Catch::Contains("tensor 'w' has shape [3, 2], the model's is [2, 3]"));
    CHECK_THAT(failure("nan.py", "t['b'][1][2] = float('nan')\nse.write_output(t)\n" + good_metrics)
                   .message(),
               Catch::Contains("tensor 'b' holds nan at element 2"));
    CHECK_THAT(failure("none.py", good_metrics).message(),
               Catch::Contains("wrote no") && Catch::Contains("update.safetensors"));
    CHECK_THAT(failure("content.py",
                       "se.write_safetensors(se.os.environ['STARLING_OUTPUT'], t, "
                       "{'starling.content': 'gradient'})\n" +
                           good_metrics)
                   .message(),
               Catch::Contains("starling.content is 'gradient'"));
  }
  SECTION("metrics: missing, not JSON, no sample count") {
    CHECK_THAT(failure("nometrics.py", "se.write_output(t)\n").message(),
               Catch::Contains("wrote no") && Catch::Contains("metrics.json"));
    CHECK_THAT(failure("notjson.py",
                       "se.write_output(t)\nopen(se.os.environ['STARLING_METRICS'], 'w')"
                       ".write('loss: 1')\n")
                   .message(),
               Catch::Contains("metrics.json: not JSON"));
    CHECK_THAT(
        failure("nosamples.py", "se.write_output(t)\nse.write_metrics(loss=1.0)\n").message(),
        Catch::Contains("\"num_samples\" is missing"));
    CHECK_THAT(
        failure("zero.py", "se.write_output(t)\nse.write_metrics(num_samples=0)\n").message(),
        Catch::Contains("\"num_samples\" must be a positive integer"));
  }
}

TEST_CASE("exec trainer: commands that cannot run are named, evaluate mode reports metrics",
          "[edge_client]") {
  const fs::path d = temp_dir("exec_cmd");
  std::vector<float> delta;
  auto missing = ExecTrainer::create(layout(), options(d, {"starling-no-such-trainer"}));
  REQUIRE(missing.ok());
  const Status st = train_once(**missing, &delta);
  CHECK(st.code() == StatusCode::kNotFound);
  CHECK_THAT(st.message(), Catch::Contains("'starling-no-such-trainer' is not on PATH"));
  std::ofstream(d / "plain.txt") << "not a program\n";
  auto plain = ExecTrainer::create(layout(), options(d, {(d / "plain.txt").string()}));
  REQUIRE(plain.ok());
  CHECK_THAT(train_once(**plain, &delta).message(), Catch::Contains("is not an executable file"));
  CHECK(!ExecTrainer::create(layout(), options(d, {})).ok());

  const auto eval = python_trainer(d, "eval.py",
                                   "assert se.mode() == 'evaluate'\n"
                                   "se.write_metrics(loss=sum(t['b'][1]), accuracy=0.75)\n");
  auto e = ExecTrainer::create(layout(), options(d, {"python3", eval.string()}));
  REQUIRE(e.ok());
  auto m = (*e)->evaluate(model(), 5);
  REQUIRE(m.ok());
  CHECK(m->loss == Approx(-0.25));
  CHECK(m->accuracy == Approx(0.75));
  CHECK(m->has_accuracy);
}

}  // namespace
}  // namespace starling::edge_client
