// RunConfig from TOML files: defaults, value checks, missing files, and every checked-in config.
#include <google/protobuf/util/message_differencer.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/toml_config.h"

namespace {

namespace fs = std::filesystem;
using starling::StatusCode;
using starling::config::load_run_config;
using starling::config::load_toml;
using starling::config::parse_toml;
using starling::config::to_toml;
using starling::config::validate_run_config;
using starling::v1::RunConfig;

// A fresh temporary directory, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "starling_config_XXXXXX").string();
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  fs::path path_;
};

// The validation error for `text`, parsed as a RunConfig named "run.toml".
std::string validation_error(const std::string& text) {
  RunConfig c;
  REQUIRE(parse_toml(text, "run.toml", &c).ok());
  const auto s = validate_run_config(c, "run.toml");
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  return s.message();
}

}  // namespace

TEST_CASE("load_run_config reads a complete config", "[config]") {
  TempDir dir;
  const auto path = dir.write("full.toml", R"(# every section
[model]
arch = "gpt"
vocab_size = 65
block_size = 256
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
bias = true
causal = false

[data]
dataset = "tinyshakespeare"
path = "/data/input.txt"
tokenizer = "GPT2"
val_fraction = 0.05
data_dir = "/data"

[train]
batch_size = 64
max_iters = 5000
optimizer = "sgd"
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
lr_decay_iters = 5000
decay_lr = false
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
momentum = 0.8
grad_clip = 1.0
eval_interval = 500
eval_iters = 200
log_interval = 10
seed = 42
out_dir = "runs/x"
threads = 2

[sample]
max_new_tokens = 100
temperature = 1.0
top_k = 0
prompt = "ROMEO:"
seed = 7
)");
  auto c = load_run_config(path);
  INFO(c.status().to_string());
  REQUIRE(c.ok());
  REQUIRE(c->model().n_embd() == 384);
  REQUIRE(c->model().dropout() == 0.2f);
  REQUIRE_FALSE(c->model().causal());
  REQUIRE(c->data().tokenizer() == starling::v1::DataConfig::GPT2);
  REQUIRE(c->train().optimizer() == starling::v1::TrainConfig::SGD);
  REQUIRE(c->train().seed() == 42u);
  REQUIRE(c->train().learning_rate() == 1e-3f);
  REQUIRE(c->sample().prompt() == "ROMEO:");
  // The effective config written by to_toml reads back to the same values.
  RunConfig back;
  REQUIRE(parse_toml(to_toml(*c), "effective.toml", &back).ok());
  // to_toml writes every field, so fields absent from the file come back set to their
  // defaults: compare values, not presence.
  REQUIRE(google::protobuf::util::MessageDifferencer::Equivalent(*c, back));
}

TEST_CASE("absent keys take the schema defaults", "[config]") {
  TempDir dir;
  auto c = load_run_config(dir.write("small.toml", "[model]\nn_head = 2\n"));
  REQUIRE(c.ok());
  REQUIRE(c->model().n_head() == 2);
  REQUIRE(c->model().n_layer() == 4);
  REQUIRE(c->model().n_embd() == 128);
  REQUIRE(c->data().val_fraction() == 0.1f);
  REQUIRE(c->train().learning_rate() == 1e-3f);
  REQUIRE(c->train().out_dir() == "runs/gpt_char_cpu");
  REQUIRE(c->sample().prompt() == "\n");
  auto empty = load_run_config(dir.write("empty.toml", ""));
  REQUIRE(empty.ok());
  REQUIRE(validate_run_config(RunConfig(), "defaults").ok());
}

TEST_CASE("to_toml of the default RunConfig records every effective value", "[config]") {
  const std::string text = to_toml(RunConfig());
  INFO(text);
  REQUIRE_THAT(text, Catch::StartsWith("[model]\narch = \"GPT\"\nvocab_size = 0\n"));
  REQUIRE_THAT(text,
               Catch::Contains("\n[train]\n") && Catch::Contains("\nlearning_rate = 0.001\n") &&
                   Catch::Contains("\nseed = 1337\n") && Catch::Contains("\nprompt = \"\\n\"\n"));
  RunConfig back;
  REQUIRE(parse_toml(text, "effective.toml", &back).ok());
  REQUIRE(back.has_model());
  REQUIRE(back.model().has_n_layer());
  REQUIRE(back.model().n_layer() == 4);
  REQUIRE(to_toml(back) == text);
}

TEST_CASE("load_run_config: missing file and schema errors name the file", "[config]") {
  TempDir dir;
  const fs::path missing = dir.write("x.toml", "").parent_path() / "absent.toml";
  auto r = load_run_config(missing);
  REQUIRE(r.status().code() == StatusCode::kNotFound);
  REQUIRE_THAT(r.status().message(), Catch::Contains(missing.string()));
  RunConfig c;
  REQUIRE(load_toml(missing, &c).code() == StatusCode::kNotFound);

  const auto typo = dir.write("typo.toml", "[train]\nbatch_size = 4\n\nlearning_rat = 0.1\n");
  REQUIRE(load_run_config(typo).status().message() ==
          typo.string() + ":4: unknown key 'train.learning_rat' (did you mean 'learning_rate'?)");
  const auto bad = dir.write("bad.toml", "[model]\nn_layer = \"four\"\n");
  REQUIRE(load_run_config(bad).status().message() ==
          bad.string() + ":2: key 'model.n_layer': expected integer (int32), got string");
}

TEST_CASE("validate_run_config rejects impossible values and names each key", "[config]") {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"[model]\nn_embd = 130",
       "run.toml: key 'model.n_embd' = 130 must be divisible by model.n_head = 4"},
      {"[model]\nn_layer = 0", "run.toml: key 'model.n_layer' = 0 must be > 0"},
      {"[model]\nblock_size = -1", "run.toml: key 'model.block_size' = -1 must be > 0"},
      {"[model]\nvocab_size = -1", "run.toml: key 'model.vocab_size' = -1 must be >= 0"},
      {"[model]\ndropout = 1.0", "run.toml: key 'model.dropout' = 1 must be in [0, 1)"},
      {"[model]\ndropout = nan", "run.toml: key 'model.dropout' = nan must be in [0, 1)"},
      {"[data]\nval_fraction = 0", "run.toml: key 'data.val_fraction' = 0 must be in (0, 1)"},
      {"[data]\ndataset = \"\"",
       "run.toml: key 'data.dataset' or 'data.path' must name the training text (both are empty)"},
      {"[train]\nbatch_size = 0", "run.toml: key 'train.batch_size' = 0 must be > 0"},
      {"[train]\nlearning_rate = -0.5",
       "run.toml: key 'train.learning_rate' = -0.5 must be finite and >= 0"},
      {"[train]\nmin_lr = inf", "run.toml: key 'train.min_lr' = inf must be finite and >= 0"},
      {"[train]\nbeta2 = 1", "run.toml: key 'train.beta2' = 1 must be in [0, 1)"},
      {"[train]\nlr_decay_iters = 50",
       "run.toml: key 'train.lr_decay_iters' = 50 must be >= train.warmup_iters = 100 when "
       "train.decay_lr is true"},
      {"[train]\neval_interval = 0", "run.toml: key 'train.eval_interval' = 0 must be > 0"},
      {"[train]\nout_dir = \"\"", "run.toml: key 'train.out_dir' must not be empty"},
      {"[sample]\ntemperature = 0",
       "run.toml: key 'sample.temperature' = 0 must be finite and > 0"},
      {"[sample]\ntop_k = -1", "run.toml: key 'sample.top_k' = -1 must be >= 0"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.text) { REQUIRE(validation_error(c.text) == c.message); }
  }
  SECTION("every violation is listed") {
    REQUIRE(validation_error("[model]\nn_layer = 0\n[train]\nbatch_size = 0\n") ==
            "run.toml: key 'model.n_layer' = 0 must be > 0\n"
            "run.toml: key 'train.batch_size' = 0 must be > 0");
  }
  SECTION("lr_decay_iters below warmup is fine without decay") {
    RunConfig c;
    REQUIRE(parse_toml("[train]\nlr_decay_iters = 50\ndecay_lr = false", "run.toml", &c).ok());
    REQUIRE(validate_run_config(c, "run.toml").ok());
  }
}

TEST_CASE("every run config in configs/ loads and validates", "[config]") {
  // fed_*.toml and sim_*.toml are federation configs (tests/aggregator/fed_config_test.cc,
  // tests/sim/), gossip_*.toml peer configs (tests/gossip/).
  const fs::path dir = fs::path(STARLING_SOURCE_DIR) / "configs";
  if (!fs::is_directory(dir)) return;
  int loaded = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    const std::string name = entry.path().filename().string();
    if (name.rfind("fed_", 0) == 0 || name.rfind("sim_", 0) == 0 || name.rfind("gossip_", 0) == 0) {
      continue;
    }
    ++loaded;
    auto c = load_run_config(entry.path());
    INFO(c.status().to_string());
    CHECK(c.ok());
  }
  CHECK(loaded >= 2);
}

TEST_CASE("open_run_dir writes config.toml and opens metrics.jsonl, a bad out_dir names the key",
          "[config]") {
  const fs::path dir = fs::temp_directory_path() / "starling_open_run_dir";
  fs::remove_all(dir);
  RunConfig c;
  c.mutable_train()->set_out_dir((dir / "run" / "nested").string());
  c.mutable_train()->set_max_iters(77);
  {
    auto metrics = starling::config::open_run_dir(c, "run.toml");
    INFO(metrics.status().to_string());
    REQUIRE(metrics.ok());
    *metrics << "{\"event\":\"x\"}\n";
  }
  RunConfig back;
  REQUIRE(load_toml(dir / "run" / "nested" / "config.toml", &back).ok());
  CHECK(back.train().max_iters() == 77);
  std::ifstream m(dir / "run" / "nested" / "metrics.jsonl");
  std::string line;
  REQUIRE(std::getline(m, line));
  CHECK(line == "{\"event\":\"x\"}");

  std::ofstream(dir / "file") << "not a folder";
  c.mutable_train()->set_out_dir((dir / "file" / "run").string());
  auto bad = starling::config::open_run_dir(c, "run.toml");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(),
             Catch::Contains("run.toml") && Catch::Contains("train.out_dir"));
  fs::remove_all(dir);
}
