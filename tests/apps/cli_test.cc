// The starling binary end to end: train/sample on a tiny corpus, certificate tooling, and the
// one-line errors (naming file, line and key) that bad input must produce.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/testing/child_process.h"

namespace fs = std::filesystem;

namespace {

using Run = starling::testing::CommandResult;
constexpr auto run = starling::testing::run_starling;

fs::path temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("starling_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

}  // namespace

TEST_CASE("cli: train a tiny GPT on a text file, then sample from it", "[apps]") {
  const fs::path d = temp_dir("train");
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "to be or not to be, that is the question.\n";
  write(d / "corpus.txt", corpus);
  write(d / "tiny.toml",
        "[model]\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
        "[data]\npath = \"" +
            (d / "corpus.txt").string() +
            "\"\n"
            "[train]\nbatch_size = 4\nmax_iters = 6\nwarmup_iters = 2\nlr_decay_iters = 6\n"
            "eval_interval = 3\neval_iters = 2\nlog_interval = 2\nthreads = 1\n"
            "out_dir = \"" +
            (d / "out").string() + "\"\n");
  Run t = run("train -c " + (d / "tiny.toml").string());
  INFO(t.out);
  REQUIRE(t.rc == 0);
  REQUIRE_THAT(t.out, Catch::Contains("trained 6 steps"));
  REQUIRE(fs::exists(d / "out" / "ckpt.safetensors"));
  REQUIRE(fs::exists(d / "out" / "metrics.jsonl"));
  {
    // The whole validation split at the end: 10% of 8,400 characters, windows of 16 in batches
    // of 4 -> 52 windows.
    std::ifstream metrics(d / "out" / "metrics.jsonl");
    const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
    CHECK_THAT(lines, Catch::Contains("\"event\":\"final\"") && Catch::Contains("\"windows\":52"));
  }
  // `starling eval` gives the whole-split loss from the checkpoint.
  Run e = run("eval " + (d / "out" / "ckpt.safetensors").string());
  INFO(e.out);
  REQUIRE(e.rc == 0);
  REQUIRE_THAT(e.out, Catch::Contains("val: 52 windows of 16 tokens"));
  Run et = run("eval -c " + (d / "tiny.toml").string() + " --split train --batch 8");
  INFO(et.out);
  REQUIRE(et.rc == 0);
  REQUIRE_THAT(et.out, Catch::Contains("train: 472 windows of 16 tokens"));
  // The fused engine's forward gives the same loss (to the printed digits); a GPU that is not
  // there is an error, never a CPU run.
  Run ef = run("eval " + (d / "out" / "ckpt.safetensors").string() + " --engine fused");
  INFO(ef.out);
  REQUIRE(ef.rc == 0);
  REQUIRE_THAT(ef.out, Catch::Contains("(next-token loss; fused engine, cpu)"));
  CHECK(ef.out.substr(ef.out.find("val: "), 80) == e.out.substr(e.out.find("val: "), 80));
  Run ec = run("eval " + (d / "out" / "ckpt.safetensors").string() + " --device cuda");
  if (ec.rc != 0) REQUIRE_THAT(ec.out, Catch::Contains("--device cuda"));  // no GPU here
  Run eb = run("eval " + (d / "out" / "ckpt.safetensors").string() + " --split test");
  REQUIRE(eb.rc != 0);
  REQUIRE(fs::exists(d / "out" / "config.toml"));

  Run s =
      run("sample " + (d / "out" / "ckpt.safetensors").string() + " -n 40 --prompt to --seed 3");
  INFO(s.out);
  REQUIRE(s.rc == 0);
  REQUIRE(s.out.rfind("to", 0) == 0);
  REQUIRE(s.out.size() >= 42);
  // --config finds the checkpoint through train.out_dir; same seed, same text.
  Run s2 = run("sample -c " + (d / "tiny.toml").string() + " -n 40 --prompt to --seed 3");
  REQUIRE(s2.rc == 0);
  REQUIRE(s2.out == s.out);
  // The KV cache is on by default; --no-kv-cache recomputes the whole context every token and
  // draws the same text (40 tokens run past block_size = 16, where the context is cropped).
  Run s3 = run("sample " + (d / "out" / "ckpt.safetensors").string() +
               " -n 40 --prompt to --seed 3 --no-kv-cache");
  REQUIRE(s3.rc == 0);
  REQUIRE(s3.out == s.out);
  // --set sample.* overrides the checkpoint's [sample]: the same as the flags, and typos fail.
  Run s4 = run("sample " + (d / "out" / "ckpt.safetensors").string() +
               " --set sample.max_new_tokens=40 --set sample.prompt=to --set sample.seed=3 --set "
               "sample.kv_cache=false");
  REQUIRE(s4.rc == 0);
  REQUIRE(s4.out == s.out);
  Run s5 = run("sample " + (d / "out" / "ckpt.safetensors").string() + " --set sample.top_kk=3");
  CHECK(s5.rc != 0);
  CHECK_THAT(s5.out, Catch::Contains("top_kk"));
}

TEST_CASE("cli: train --ranks 2 trains data-parallel and checkpoints, bad requests are refused",
          "[apps]") {
  const fs::path d = temp_dir("ranks");
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "to be or not to be, that is the question.\n";
  write(d / "corpus.txt", corpus);
  write(d / "tiny.toml",
        "[model]\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
        "[data]\npath = \"" +
            (d / "corpus.txt").string() +
            "\"\n"
            "[train]\nbatch_size = 4\nmax_iters = 4\nwarmup_iters = 2\nlr_decay_iters = 4\n"
            "eval_interval = 2\neval_iters = 1\nlog_interval = 1\nthreads = 2\n"
            "out_dir = \"" +
            (d / "out").string() + "\"\n");
  Run t = run("train -c " + (d / "tiny.toml").string() + " --ranks 2 --bucket-mb 0.001");
  INFO(t.out);
  REQUIRE(t.rc == 0);
  REQUIRE_THAT(t.out, Catch::Contains("trained 4 steps on 2 ranks"));
  REQUIRE(fs::exists(d / "out" / "ckpt.safetensors"));
  Run s = run("sample " + (d / "out" / "ckpt.safetensors").string() + " -n 10 --prompt to");
  REQUIRE(s.rc == 0);

  Run odd = run("train -c " + (d / "tiny.toml").string() + " --ranks 3");
  REQUIRE(odd.rc != 0);
  REQUIRE_THAT(odd.out, Catch::Contains("not a multiple of --ranks 3"));
  // The fused engine's data parallel: two replicas on CPU threads (the code --gpus 0,1 runs over
  // NCCL), and the requests it refuses.
  Run fused_ranks =
      run("train -c " + (d / "tiny.toml").string() +
          " --set train.engine=fused --ranks 2 --set train.out_dir=" + (d / "fused2").string());
  INFO(fused_ranks.out);
  REQUIRE(fused_ranks.rc == 0);
  REQUIRE_THAT(fused_ranks.out, Catch::Contains("(fused, cpu, 2 ranks)"));
  REQUIRE(fs::exists(d / "fused2" / "ckpt.safetensors"));
  // train.attention picks the GPU's attention path (the CPU backend has one): accepted here,
  // typos refused by key.
  Run attention = run("train -c " + (d / "tiny.toml").string() +
                      " --set train.engine=fused --set train.attention=materialized --set "
                      "train.out_dir=" +
                      (d / "fused_att").string());
  INFO(attention.out);
  REQUIRE(attention.rc == 0);
  Run attention_typo = run("train -c " + (d / "tiny.toml").string() +
                           " --set train.engine=fused --set train.attention=flashy");
  REQUIRE(attention_typo.rc != 0);
  REQUIRE_THAT(attention_typo.out, Catch::Contains("attention"));
  Run fused_odd =
      run("train -c " + (d / "tiny.toml").string() + " --set train.engine=fused --ranks 3");
  REQUIRE(fused_odd.rc != 0);
  REQUIRE_THAT(fused_odd.out, Catch::Contains("not a multiple of the 3 data-parallel ranks"));
  Run twice = run("train -c " + (d / "tiny.toml").string() + " --gpus 0,0");
  REQUIRE(twice.rc != 0);
  REQUIRE_THAT(twice.out, Catch::Contains("named twice"));
  Run gpu_ranks = run("train -c " + (d / "tiny.toml").string() + " --gpus 0 --ranks 2");
  REQUIRE(gpu_ranks.rc != 0);
  // --device cuda trains on a GPU where one is visible, and is refused with the reason elsewhere.
  const bool gpu_visible = run("info").out.find("cuda devices: none") == std::string::npos;
  Run gpu = run("train -c " + (d / "tiny.toml").string() + " --device cuda");
  INFO(gpu.out);
  if (gpu_visible) {
    REQUIRE(gpu.rc == 0);
    REQUIRE_THAT(gpu.out, Catch::Contains("fused, cuda:0"));
  } else {
    REQUIRE(gpu.rc != 0);
    REQUIRE_THAT(gpu.out, Catch::Contains("no GPU training path"));
  }
}

TEST_CASE("cli: train.engine = fused trains the same GPT as the autograd engine", "[apps]") {
  const fs::path d = temp_dir("fused");
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "to be or not to be, that is the question.\n";
  write(d / "corpus.txt", corpus);
  const std::string base =
      "[model]\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
      "[data]\npath = \"" +
      (d / "corpus.txt").string() +
      "\"\n"
      "[train]\nbatch_size = 4\nmax_iters = 5\nwarmup_iters = 2\nlr_decay_iters = 5\n"
      "eval_interval = 5\neval_iters = 2\nlog_interval = 1\nthreads = 1\n";
  write(d / "autograd.toml", base + "out_dir = \"" + (d / "a").string() + "\"\n");
  write(d / "fused.toml", base + "engine = \"fused\"\nout_dir = \"" + (d / "f").string() + "\"\n");
  Run a = run("train -c " + (d / "autograd.toml").string());
  Run f = run("train -c " + (d / "fused.toml").string());
  INFO(a.out << f.out);
  REQUIRE(a.rc == 0);
  REQUIRE(f.rc == 0);
  REQUIRE_THAT(f.out, Catch::Contains("fused, cpu"));
  // Same val loss to the 4 decimals printed ("val loss X (best Y)").
  auto val = [](const std::string& out) { return out.substr(out.find("val loss"), 16); };
  CHECK(val(a.out) == val(f.out));
  Run s = run("sample " + (d / "f" / "ckpt.safetensors").string() + " -n 20 --prompt to");
  REQUIRE(s.rc == 0);
  REQUIRE(s.out.rfind("to", 0) == 0);
  // bf16 linear layers: the fused engine takes them, the autograd engine refuses.
  Run bf16 = run("train -c " + (d / "fused.toml").string() + " --set train.precision=bf16");
  INFO(bf16.out);
  REQUIRE(bf16.rc == 0);
  std::ifstream metrics(d / "f" / "metrics.jsonl");
  const std::string lines((std::istreambuf_iterator<char>(metrics)), {});
  CHECK_THAT(lines, Catch::Contains("\"precision\":\"bf16\""));
  Run fp32_only = run("train -c " + (d / "autograd.toml").string() + " --set train.precision=bf16");
  REQUIRE(fp32_only.rc != 0);
  REQUIRE_THAT(fp32_only.out, Catch::Contains("fp32 only"));
  // MDLM configs train on the fused engine too (models/mdlm/fused_engine.h).
  Run mdlm = run(
      "train -c " + (d / "fused.toml").string() +
      " --set model.arch=mdlm --set model.causal=false --set train.out_dir=" + (d / "fm").string());
  INFO(mdlm.out);
  REQUIRE(mdlm.rc == 0);
  REQUIRE(fs::exists(d / "fm" / "ckpt.safetensors"));
  Run fm_eval = run("eval " + (d / "fm" / "ckpt.safetensors").string());
  REQUIRE(fm_eval.rc == 0);
  REQUIRE_THAT(fm_eval.out, Catch::Contains("NELBO bound"));
  // RoPE and block diffusion train on the fused engine too (models/mdlm/fused_engine.h).
  Run rope = run("train -c " + (d / "fused.toml").string() +
                 " --set model.arch=mdlm --set model.causal=false --set model.pos_encoding=rope"
                 " --set diffusion.block_length=4 --set train.out_dir=" +
                 (d / "fr").string());
  INFO(rope.out);
  REQUIRE(rope.rc == 0);
  REQUIRE_THAT(rope.out, Catch::Contains("fused, cpu"));
  Run fr_eval = run("eval " + (d / "fr" / "ckpt.safetensors").string());
  REQUIRE(fr_eval.rc == 0);
  REQUIRE_THAT(fr_eval.out, Catch::Contains("NELBO bound"));
  // What the fused engine still refuses names the key.
  Run uniform = run("train -c " + (d / "fused.toml").string() +
                    " --set model.arch=mdlm --set diffusion.noise=uniform");
  REQUIRE(uniform.rc != 0);
  REQUIRE_THAT(uniform.out, Catch::Contains("diffusion.noise"));
}

TEST_CASE("cli: train and sample a tiny masked diffusion LM", "[apps]") {
  const fs::path d = temp_dir("mdlm");
  std::string corpus;
  for (int i = 0; i < 100; ++i) corpus += "the quick brown fox jumps over the lazy dog.\n";
  write(d / "corpus.txt", corpus);
  write(d / "mdlm.toml",
        "[model]\narch = \"mdlm\"\nblock_size = 16\nn_layer = 1\nn_head = 2\n"
        "n_embd = 16\ncausal = false\n[data]\npath = \"" +
            (d / "corpus.txt").string() +
            "\"\n[train]\nbatch_size = 4\nmax_iters = 4\nwarmup_iters = 1\n"
            "lr_decay_iters = 4\neval_interval = 2\neval_iters = 1\nlog_interval = 2\n"
            "threads = 1\nout_dir = \"" +
            (d / "out").string() + "\"\n[diffusion]\nsampling_steps = 8\n");
  Run t = run("train -c " + (d / "mdlm.toml").string());
  INFO(t.out);
  REQUIRE(t.rc == 0);
  REQUIRE(fs::exists(d / "out" / "ckpt.safetensors"));
  Run s = run("sample " + (d / "out" / "ckpt.safetensors").string() + " --steps 8 --seed 2");
  INFO(s.out);
  REQUIRE(s.rc == 0);
  REQUIRE(s.out.size() >= 16);  // one sample of T = 16 characters

  // Block diffusion: blocks of 4, trained, evaluated and sampled block by block.
  Run bt =
      run("train -c " + (d / "mdlm.toml").string() +
          " --set diffusion.block_length=4 --set diffusion.masking=count --set train.out_dir=" +
          (d / "bd3").string());
  INFO(bt.out);
  REQUIRE(bt.rc == 0);
  {
    std::ifstream effective(d / "bd3" / "config.toml");
    const std::string text((std::istreambuf_iterator<char>(effective)), {});
    REQUIRE_THAT(text, Catch::Contains("block_length = 4"));
  }
  Run bs = run("sample " + (d / "bd3" / "ckpt.safetensors").string() + " --steps 4 --seed 2");
  INFO(bs.out);
  REQUIRE(bs.rc == 0);
  REQUIRE(bs.out.size() >= 16);
  // Without the KV cache of the clean blocks: the same sample.
  Run bs_plain = run("sample " + (d / "bd3" / "ckpt.safetensors").string() +
                     " --steps 4 --seed 2 --no-kv-cache");
  REQUIRE(bs_plain.rc == 0);
  REQUIRE(bs_plain.out == bs.out);
  // The bound over the whole validation split, with either estimator; the same seed repeats.
  Run e1 = run("eval " + (d / "bd3" / "ckpt.safetensors").string() + " --seed 3");
  Run e2 = run("eval " + (d / "bd3" / "ckpt.safetensors").string() + " --seed 3");
  Run eb = run("eval " + (d / "bd3" / "ckpt.safetensors").string() + " --masking bernoulli");
  INFO(e1.out << eb.out);
  REQUIRE(e1.rc == 0);
  REQUIRE(e1.out == e2.out);
  REQUIRE_THAT(e1.out, Catch::Contains("windows of 16 tokens") && Catch::Contains("count"));
  // The fused engine's forward: the same windows, times and masks, the same bound.
  Run ef = run("eval " + (d / "bd3" / "ckpt.safetensors").string() + " --seed 3 --engine fused");
  INFO(ef.out);
  REQUIRE(ef.rc == 0);
  REQUIRE_THAT(ef.out, Catch::Contains("fused engine, cpu"));
  CHECK(ef.out.substr(ef.out.find("val: "), 80) == e1.out.substr(e1.out.find("val: "), 80));
  REQUIRE_THAT(eb.out, Catch::Contains("bernoulli estimator"));
  Run bad = run("train -c " + (d / "mdlm.toml").string() + " --set diffusion.block_length=5");
  REQUIRE(bad.rc != 0);
  REQUIRE_THAT(bad.out, Catch::Contains("diffusion.block_length = 5"));
}

TEST_CASE("cli: bad configs and checkpoints give one clear error and a non-zero exit", "[apps]") {
  const fs::path d = temp_dir("errors");
  SECTION("missing config file") {
    Run r = run("train -c " + (d / "nope.toml").string());
    REQUIRE(r.rc != 0);
    REQUIRE_THAT(r.out, Catch::Contains("nope.toml"));
  }
  SECTION("mistyped key names file, line and a suggestion") {
    write(d / "typo.toml", "[model]\nn_layer = 2\n\n[train]\nlearnig_rate = 0.1\n");
    Run r = run("train -c " + (d / "typo.toml").string());
    REQUIRE(r.rc != 0);
    REQUIRE_THAT(r.out, Catch::Contains("typo.toml:5") && Catch::Contains("train.learnig_rate") &&
                            Catch::Contains("learning_rate"));
  }
  SECTION("wrong type") {
    write(d / "type.toml", "[model]\nn_head = \"four\"\n");
    Run r = run("train -c " + (d / "type.toml").string());
    REQUIRE(r.rc != 0);
    REQUIRE_THAT(r.out, Catch::Contains("type.toml:2") && Catch::Contains("model.n_head"));
  }
  SECTION("missing data file") {
    write(d / "data.toml", "[data]\npath = \"" + (d / "absent.txt").string() + "\"\n");
    Run r = run("train -c " + (d / "data.toml").string());
    REQUIRE(r.rc != 0);
    REQUIRE_THAT(r.out, Catch::Contains("absent.txt"));
  }
  SECTION("corrupt checkpoint") {
    write(d / "bad.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
    Run r = run("sample " + (d / "bad.safetensors").string());
    REQUIRE(r.rc != 0);
    REQUIRE_THAT(r.out, Catch::Contains("bad.safetensors"));
  }
  SECTION("bad --set override") {
    Run r = run("train -c " + std::string(STARLING_SOURCE_DIR) +
                "/configs/gpt_char_cpu.toml --set model.n_layers=3");
    REQUIRE(r.rc != 0);
    REQUIRE_THAT(r.out, Catch::Contains("model.n_layers"));
  }
}

TEST_CASE("cli: certs init-ca, issue and show", "[apps]") {
  const fs::path d = temp_dir("certs");
  Run ca = run("certs init-ca --out " + (d / "ca").string() + " --name test-federation");
  INFO(ca.out);
  REQUIRE(ca.rc == 0);
  REQUIRE(fs::exists(d / "ca" / "ca.crt"));
  struct stat st {};
  REQUIRE(stat((d / "ca" / "ca.key").c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0600);
  Run issue = run("certs issue --ca " + (d / "ca").string() +
                  " --name client-7 --role client --out " + (d / "client").string());
  INFO(issue.out);
  REQUIRE(issue.rc == 0);
  fs::path crt;
  for (const auto& e : fs::directory_iterator(d / "client")) {
    if (e.path().extension() == ".crt" && e.path().filename() != "ca.crt") crt = e.path();
  }
  REQUIRE_FALSE(crt.empty());
  Run show = run("certs show " + crt.string());
  INFO(show.out);
  REQUIRE(show.rc == 0);
  REQUIRE_THAT(show.out, Catch::Contains("client-7"));
  Run bad = run("certs show " + (d / "nothing.crt").string());
  REQUIRE(bad.rc != 0);
}
