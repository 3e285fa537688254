// Hugging Face GPT-2 import and export against tests/fixtures/hf_gpt2_tiny (a tiny GPT-2 that
// `transformers` wrote, with the logits it computed): logits within 1e-4, the tokenizer id for
// id, export -> import and checkpoint round trips, and refusals naming the tensor or key.
#include "models/gpt/hf.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/autograd/autograd.h"
#include "core/io/safetensors.h"
#include "models/gpt/checkpoint.h"
#include "models/gpt/lora.h"
#include "models/gpt/trainer.h"
#include "tests/testing/tiny_runs.h"

using starling::max_abs_diff;
using starling::Tensor;
namespace fs = std::filesystem;
namespace io = starling::io;
namespace models = starling::models;

namespace {

fs::path fixture() { return fs::path(STARLING_SOURCE_DIR) / "tests" / "fixtures" / "hf_gpt2_tiny"; }

fs::path temp_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / "starling_hf_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A copy of the fixture's model files to break.
fs::path fixture_copy(const std::string& name) {
  const auto dir = temp_dir(name);
  for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
    fs::copy_file(fixture() / f, dir / f);
  }
  return dir;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

struct Expected {
  Tensor ids, logits, logits7, loss;
};

Expected expected() {
  auto f = io::load_safetensors(fixture() / "expected.safetensors");
  REQUIRE(f.ok());
  Expected e;
  for (auto& [name, t] : f->tensors) {
    if (name == "input_ids") e.ids = t;
    if (name == "logits") e.logits = t;
    if (name == "logits_len7") e.logits7 = t;
    if (name == "loss") e.loss = t;
  }
  REQUIRE(e.ids.defined());
  REQUIRE(e.logits.defined());
  return e;
}

Tensor logits_of(const models::Gpt& m, const Tensor& ids) {
  starling::autograd::NoGradGuard ng;
  return m.forward(ids);
}

std::string load_error(const fs::path& dir) {
  auto r = models::load_hf_gpt2(dir);
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

}  // namespace

TEST_CASE("an imported Hugging Face GPT-2 gives transformers' logits within 1e-4", "[models][hf]") {
  auto m = models::load_hf_gpt2(fixture());
  REQUIRE(m.ok());
  REQUIRE(m->config.n_layer == 2);
  REQUIRE(m->config.n_embd == 32);
  REQUIRE(m->config.vocab_size == 320);
  REQUIRE(m->config.block_size == 32);
  REQUIRE(m->config.bias);
  REQUIRE(m->config.gelu_tanh);
  const Expected e = expected();
  m->gpt->train(false);
  const Tensor logits = logits_of(*m->gpt, e.ids);
  REQUIRE(max_abs_diff(logits, e.logits) < 1e-4);
  // A shorter sequence (causal: the first 7 positions on their own).
  const Tensor ids7 = e.ids.slice(1, 0, 7).contiguous();
  REQUIRE(max_abs_diff(logits_of(*m->gpt, ids7), e.logits7) < 1e-4);
  // The next-token loss of row 0, Hugging Face's shift convention.
  const Tensor row = e.ids.slice(0, 0, 1).contiguous();
  starling::autograd::NoGradGuard ng;
  const double loss =
      m->gpt->loss(row.slice(1, 0, 15).contiguous(), row.slice(1, 1, 16).contiguous()).item();
  REQUIRE(std::fabs(loss - e.loss.item()) < 1e-4);
}

TEST_CASE("the imported tokenizer encodes as transformers' did", "[models][hf]") {
  auto m = models::load_hf_gpt2(fixture());
  REQUIRE(m.ok());
  REQUIRE(m->tokenizer);
  REQUIRE(m->tokenizer->vocab_size() == 320);
  REQUIRE(m->tokenizer->eot_id() == 0);
  auto ids = m->tokenizer->encode("First Citizen:\nBefore");
  REQUIRE(ids.ok());
  const auto want = expected().ids.slice(0, 0, 1).contiguous();
  const int32_t* w = want.data<int32_t>();
  REQUIRE(*ids == std::vector<int32_t>(w, w + 16));
}

TEST_CASE("export -> import gives the same model, files as transformers writes them",
          "[models][hf]") {
  auto m = models::load_hf_gpt2(fixture());
  REQUIRE(m.ok());
  const auto dir = temp_dir("export");
  REQUIRE(models::save_hf_gpt2(dir, *m->gpt, m->tokenizer.get()).ok());
  auto file = io::load_safetensors(dir / "model.safetensors");
  REQUIRE(file.ok());
  REQUIRE(file->tensors.size() == 2 + 2 * 12 + 2);  // wte, wpe, 12 per block, ln_f
  for (const auto& [name, t] : file->tensors) {
    INFO(name);
    REQUIRE(name.starts_with("transformer."));
    if (name == "transformer.h.0.attn.c_attn.weight") {
      REQUIRE(t.shape() == starling::Shape{32, 96});  // Conv1D: (in, out)
    }
  }
  const auto cfg = nlohmann::json::parse(read(dir / "config.json"));
  REQUIRE(cfg["model_type"] == "gpt2");
  REQUIRE(cfg["activation_function"] == "gelu_new");
  REQUIRE(cfg["n_positions"] == 32);
  REQUIRE(cfg["vocab_size"] == 320);
  REQUIRE(read(dir / "vocab.json") == read(fixture() / "vocab.json"));
  REQUIRE(read(dir / "merges.txt") == read(fixture() / "merges.txt"));
  auto back = models::load_hf_gpt2(dir);
  REQUIRE(back.ok());
  const Tensor ids = expected().ids;
  REQUIRE(max_abs_diff(logits_of(*back->gpt, ids), logits_of(*m->gpt, ids)) == 0.0);
}

TEST_CASE("an exported LoRA model holds the merged weights", "[models][hf]") {
  auto m = models::load_hf_gpt2(fixture());
  REQUIRE(m.ok());
  models::LoraSpec s;
  s.rank = 2;
  s.targets = models::lora_target_names();
  auto adapted = models::make_gpt(m->config, 0, m->gpt.get(), s);
  REQUIRE(adapted.ok());
  starling::Rng rng(4);
  for (auto& [name, t] : (*adapted)->named_trainable_parameters()) {
    if (name.find("lora_B") != std::string::npos) {
      t.copy_from(Tensor::randn(t.shape(), rng, 0.1));
    }
  }
  const auto dir = temp_dir("export_lora");
  REQUIRE(models::save_hf_gpt2(dir, **adapted, m->tokenizer.get()).ok());
  auto back = models::load_hf_gpt2(dir);
  REQUIRE(back.ok());
  const Tensor ids = expected().ids;
  (*adapted)->train(false);
  REQUIRE(max_abs_diff(logits_of(*back->gpt, ids), logits_of(**adapted, ids)) < 1e-5);
  REQUIRE(max_abs_diff(logits_of(*back->gpt, ids), logits_of(*m->gpt, ids)) > 1e-3);
}

TEST_CASE("an imported model round-trips through a starling checkpoint with its tokenizer",
          "[models][hf]") {
  auto m = models::load_hf_gpt2(fixture());
  REQUIRE(m.ok());
  starling::v1::RunConfig rc;
  *rc.mutable_model() = m->model;
  rc.mutable_data()->set_tokenizer(starling::v1::DataConfig::GPT2);
  // A data directory without GPT-2's files: the checkpoint must carry its own tokenizer.
  rc.mutable_data()->set_data_dir(temp_dir("no_data").string());
  const auto path = temp_dir("ckpt") / "imported.safetensors";
  REQUIRE(models::save_gpt_checkpoint(path, *m->gpt, rc, *m->tokenizer, {0, 0.0, 0.0}).ok());
  auto loaded = models::load_gpt_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->tokenizer->vocab_size() == 320);
  REQUIRE(loaded->model->config().gelu_tanh);
  const Tensor ids = expected().ids;
  REQUIRE(max_abs_diff(logits_of(*loaded->model, ids), expected().logits) < 1e-4);
  auto pre = models::load_pretrained_gpt(path.string(), "");
  REQUIRE(pre.ok());
  REQUIRE(pre->model.vocab_size() == 320);
  REQUIRE_THAT(pre->describe, Catch::Contains("L=2 H=4 C=32 T=32 V=320"));
}

TEST_CASE("init_from: hf:NAME under the data dir, and the first present of a list",
          "[models][hf]") {
  // A data directory holding the fixture as "gpt2-124m" stands in for a downloaded GPT-2 124M.
  const auto data = temp_dir("data_dir");
  fs::create_directories(data / "gpt2-124m");
  for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
    fs::copy_file(fixture() / f, data / "gpt2-124m" / f);
  }
  auto by_name = models::load_pretrained_gpt("hf:gpt2-124m", data);
  REQUIRE(by_name.ok());
  CHECK_THAT(by_name->describe, Catch::Contains((data / "gpt2-124m").string()));
  CHECK(by_name->model.vocab_size() == 320);

  CHECK(models::init_from_alternatives(" hf:a ,, b.safetensors ") ==
        std::vector<std::string>{"hf:a", "b.safetensors"});
  // The first alternative present wins; the absent ones before it are named in the description.
  auto second = models::load_pretrained_gpt("hf:no-such-model, hf:gpt2-124m", data);
  REQUIRE(second.ok());
  CHECK_THAT(second->describe, Catch::Contains("absent: hf:no-such-model"));
  auto first = models::load_pretrained_gpt("hf:gpt2-124m, /nonexistent/ckpt.safetensors", data);
  REQUIRE(first.ok());

  // None present: NotFound naming the list and how to fetch GPT-2 124M.
  const auto empty = temp_dir("empty_data_dir");
  auto none = models::load_pretrained_gpt("hf:gpt2-124m, /nonexistent/ckpt.safetensors", empty);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == starling::StatusCode::kNotFound);
  CHECK_THAT(none.status().message(), Catch::Contains("none of the models in"));
  CHECK_THAT(none.status().message(), Catch::Contains("starling data download gpt2-124m"));
  auto single = models::load_pretrained_gpt("hf:gpt2-124m", empty);
  REQUIRE_FALSE(single.ok());
  CHECK_THAT(single.status().message(), Catch::Contains("starling data download gpt2-124m"));

  // Present but broken is an error, never a silent fall back to the next alternative.
  fs::remove(data / "gpt2-124m" / "model.safetensors");
  auto broken = models::load_pretrained_gpt("hf:gpt2-124m, hf:" + fixture().string(), data);
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(broken.status().message(), Catch::Contains("model.safetensors"));
}

TEST_CASE("init_from: shape keys that contradict the pretrained model are refused",
          "[models][hf]") {
  auto pre = models::load_pretrained_gpt("hf:" + fixture().string(), "");
  REQUIRE(pre.ok());
  models::ShapeKeys same;
  same.n_layer = 2;
  same.n_embd = 32;
  same.block_size = 16;  // a shorter training context is fine
  CHECK(models::check_pretrained_shape(*pre, same, "cfg.toml").ok());
  models::ShapeKeys wrong = same;
  wrong.n_head = 8;
  auto s = models::check_pretrained_shape(*pre, wrong, "cfg.toml");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("cfg.toml: key 'model.n_head' = 8"));
  CHECK_THAT(s.message(), Catch::Contains("has 4; remove the key"));
  models::ShapeKeys longer;
  longer.block_size = 33;
  CHECK_THAT(models::check_pretrained_shape(*pre, longer, "cfg.toml").message(),
             Catch::Contains("longer than the pretrained model's 32 positions"));
  models::ShapeKeys rope;
  rope.rope = true;
  CHECK_THAT(models::check_pretrained_shape(*pre, rope, "cfg.toml").message(),
             Catch::Contains("uses learned positions"));
}

TEST_CASE("broken Hugging Face directories are refused naming the tensor or key", "[models][hf]") {
  SECTION("a missing tensor") {
    const auto dir = fixture_copy("missing");
    auto f = io::load_safetensors(dir / "model.safetensors");
    REQUIRE(f.ok());
    io::StateDict kept;
    for (auto& [name, t] : f->tensors) {
      if (name != "transformer.h.1.mlp.c_fc.bias") kept.emplace_back(name, t);
    }
    REQUIRE(io::save_safetensors(dir / "model.safetensors", kept).ok());
    REQUIRE_THAT(load_error(dir), Catch::Contains("missing tensor 'h.1.mlp.c_fc.bias'"));
  }
  SECTION("a tensor of the wrong shape (a Linear layout where Conv1D belongs)") {
    const auto dir = fixture_copy("shape");
    auto f = io::load_safetensors(dir / "model.safetensors");
    REQUIRE(f.ok());
    for (auto& [name, t] : f->tensors) {
      if (name == "transformer.h.0.attn.c_attn.weight") t = t.transpose(0, 1).contiguous();
    }
    REQUIRE(io::save_safetensors(dir / "model.safetensors", f->tensors).ok());
    const auto msg = load_error(dir);
    REQUIRE_THAT(msg, Catch::Contains("transformer.h.0.attn.c_attn.weight") &&
                          Catch::Contains("[96, 32]") && Catch::Contains("expected [32, 96]"));
  }
  SECTION("an unknown tensor") {
    const auto dir = fixture_copy("extra");
    auto f = io::load_safetensors(dir / "model.safetensors");
    REQUIRE(f.ok());
    f->tensors.emplace_back("transformer.h.0.attn.q_norm.weight", Tensor::ones({32}));
    REQUIRE(io::save_safetensors(dir / "model.safetensors", f->tensors).ok());
    REQUIRE_THAT(load_error(dir), Catch::Contains("unexpected tensor "
                                                  "'transformer.h.0.attn.q_norm.weight'"));
  }
  SECTION("an untied head") {
    const auto dir = fixture_copy("untied");
    auto f = io::load_safetensors(dir / "model.safetensors");
    REQUIRE(f.ok());
    f->tensors.emplace_back("lm_head.weight", Tensor::ones({320, 32}));
    REQUIRE(io::save_safetensors(dir / "model.safetensors", f->tensors).ok());
    REQUIRE_THAT(load_error(dir), Catch::Contains("'lm_head.weight'"));
  }
  SECTION("a truncated weight file") {
    const auto dir = fixture_copy("truncated");
    const std::string bytes = read(dir / "model.safetensors");
    write(dir / "model.safetensors", bytes.substr(0, bytes.size() / 2));
    REQUIRE_THAT(load_error(dir), Catch::Contains("model.safetensors"));
  }
  SECTION("no weight file") {
    const auto dir = fixture_copy("no_weights");
    fs::remove(dir / "model.safetensors");
    write(dir / "pytorch_model.bin", "x");
    REQUIRE_THAT(load_error(dir),
                 Catch::Contains("pytorch_model.bin") && Catch::Contains("safe_serialization"));
  }
  SECTION("another architecture") {
    const auto dir = fixture_copy("llama");
    auto cfg = nlohmann::json::parse(read(dir / "config.json"));
    cfg["model_type"] = "llama";
    cfg["architectures"] = {"LlamaForCausalLM"};
    write(dir / "config.json", cfg.dump());
    REQUIRE_THAT(load_error(dir), Catch::Contains("config.json") && Catch::Contains("\"llama\"") &&
                                      Catch::Contains("LlamaForCausalLM"));
  }
  SECTION("a GPT-2 option starling does not compute") {
    const auto dir = fixture_copy("relu");
    auto cfg = nlohmann::json::parse(read(dir / "config.json"));
    cfg["activation_function"] = "relu";
    write(dir / "config.json", cfg.dump());
    REQUIRE_THAT(load_error(dir), Catch::Contains("activation_function"));
    cfg["activation_function"] = "gelu_new";
    cfg["n_inner"] = 64;
    write(dir / "config.json", cfg.dump());
    REQUIRE_THAT(load_error(dir), Catch::Contains("n_inner"));
  }
  SECTION("a config.json that disagrees with the weights") {
    const auto dir = fixture_copy("wider");
    auto cfg = nlohmann::json::parse(read(dir / "config.json"));
    cfg["n_embd"] = 64;
    write(dir / "config.json", cfg.dump());
    REQUIRE_THAT(load_error(dir),
                 Catch::Contains("transformer.wte.weight") || Catch::Contains("transformer.h.0"));
  }
  SECTION("half a tokenizer") {
    const auto dir = fixture_copy("half_tokenizer");
    fs::remove(dir / "merges.txt");
    REQUIRE_THAT(load_error(dir), Catch::Contains("vocab.json without merges.txt"));
  }
  SECTION("malformed JSON") {
    const auto dir = fixture_copy("bad_json");
    write(dir / "config.json", "{\"model_type\": \"gpt2\",");
    REQUIRE_THAT(load_error(dir), Catch::Contains("config.json: malformed JSON"));
  }
}

TEST_CASE("starling train fine-tunes an imported model with LoRA into a merged checkpoint",
          "[models][hf][lora]") {
  const auto dir = temp_dir("train_lora");
  const std::string model = "[model]\narch = \"gpt\"\ninit_from = \"hf:" + fixture().string() +
                            "\"\nblock_size = 16\n[lora]\nrank = 4\nalpha = 8\n";
  const auto cfg = starling::testing::tiny_text_run(dir, "lora", model);
  auto r = models::train_gpt(cfg, "lora.toml");
  INFO(r.status().message());
  REQUIRE(r.ok());
  auto trained = models::load_gpt_checkpoint(dir / "lora" / "ckpt.safetensors");
  REQUIRE(trained.ok());
  // The base's shape, position table and tokenizer; the context trained on was 16.
  REQUIRE(trained->model->config().block_size == 32);
  REQUIRE(trained->model->config().gelu_tanh);
  REQUIRE(trained->tokenizer->vocab_size() == 320);
  REQUIRE(trained->config.model().init_from().empty());
  auto base = models::load_hf_gpt2(fixture());
  REQUIRE(base.ok());
  // Only the four adapted projections changed; every other tensor is the base's, bit for bit.
  std::map<std::string, Tensor> before;
  for (auto& [name, t] : base->gpt->named_parameters()) before.emplace(name, t);
  int changed = 0;
  for (auto& [name, t] : trained->model->named_parameters()) {
    INFO(name);
    const bool adapted = name.ends_with("c_attn.weight") || name.ends_with("c_proj.weight") ||
                         name.ends_with("c_fc.weight");
    const double d = max_abs_diff(t, before.at(name));
    if (adapted) {
      REQUIRE(d > 0);
      ++changed;
    } else {
      REQUIRE(d == 0);
    }
  }
  REQUIRE(changed == 8);
  // The context may not exceed the base's positions, and the shape is the base's.
  auto long_ctx = starling::testing::tiny_text_run(dir, "long", model);
  long_ctx.mutable_model()->set_block_size(64);
  REQUIRE_THAT(models::train_gpt(long_ctx, "long.toml").status().message(),
               Catch::Contains("model.block_size") && Catch::Contains("32 positions"));
  auto wide = starling::testing::tiny_text_run(dir, "wide", model);
  wide.mutable_model()->set_n_embd(64);
  REQUIRE_THAT(models::train_gpt(wide, "wide.toml").status().message(),
               Catch::Contains("key 'model.n_embd' = 64") && Catch::Contains("has 32"));
}
