// Value checks of a RunConfig: the constraints the schema's types cannot express.
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/toml_config.h"

namespace starling::config {
namespace {

std::string num(double x) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, res.ptr);
}
std::string num(float x) { return num(static_cast<double>(x)); }
std::string num(int32_t x) { return std::to_string(x); }

class Checker {
 public:
  explicit Checker(std::string_view source) : source_(source) {}

  // Records "SOURCE: key 'KEY' = VALUE RULE" unless `ok`.
  template <typename T>
  void require(bool ok, std::string_view key, T value, std::string_view rule) {
    if (ok) return;
    errors_ += errors_.empty() ? "" : "\n";
    errors_ += std::string(source_) + ": key '" + std::string(key) + "' = " + num(value) + " " +
               std::string(rule);
  }
  void positive(std::string_view key, int32_t v) { require(v > 0, key, v, "must be > 0"); }
  void non_negative(std::string_view key, int32_t v) { require(v >= 0, key, v, "must be >= 0"); }
  void non_negative(std::string_view key, float v) {
    require(std::isfinite(v) && v >= 0, key, v, "must be finite and >= 0");
  }
  void unit_interval(std::string_view key, float v) {  // [0, 1)
    require(v >= 0 && v < 1, key, v, "must be in [0, 1)");
  }
  void text(bool ok, std::string_view what) {
    if (ok) return;
    errors_ += errors_.empty() ? "" : "\n";
    errors_ += std::string(source_) + ": " + std::string(what);
  }

  Status status() const { return errors_.empty() ? ok_status() : invalid_argument(errors_); }

 private:
  std::string_view source_;
  std::string errors_;
};

}  // namespace

Status validate_run_config(const starling::v1::RunConfig& c, std::string_view source_name) {
  Checker k(source_name);
  const auto& m = c.model();
  k.non_negative("model.vocab_size", m.vocab_size());
  k.positive("model.block_size", m.block_size());
  k.positive("model.n_layer", m.n_layer());
  k.positive("model.n_head", m.n_head());
  k.positive("model.n_embd", m.n_embd());
  if (m.n_head() > 0 && m.n_embd() > 0) {
    k.require(m.n_embd() % m.n_head() == 0, "model.n_embd", m.n_embd(),
              "must be divisible by model.n_head = " + std::to_string(m.n_head()));
  }
  k.unit_interval("model.dropout", m.dropout());
  if (m.pos_encoding() == starling::v1::ModelConfig::ROPE) {
    k.require(std::isfinite(m.rope_base()) && m.rope_base() > 1, "model.rope_base", m.rope_base(),
              "must be finite and > 1");
    if (m.n_head() > 0 && m.n_embd() > 0 && m.n_embd() % m.n_head() == 0) {
      k.require((m.n_embd() / m.n_head()) % 2 == 0, "model.n_embd", m.n_embd(),
                "must give an even head size (n_embd / n_head) with model.pos_encoding = "
                "\"rope\"");
    }
  }

  if (m.arch() != starling::v1::ModelConfig::GPT) {
    k.text(m.init_from().empty(), "key 'model.init_from' applies to model.arch = \"gpt\" only");
    k.text(c.lora().rank() == 0, "[lora] applies to model.arch = \"gpt\" only");
    k.text(m.activation() != starling::v1::ModelConfig::GELU_TANH,
           "key 'model.activation' = \"gelu_tanh\" applies to model.arch = \"gpt\" only");
  }

  const auto& d = c.data();
  k.require(d.val_fraction() > 0 && d.val_fraction() < 1, "data.val_fraction", d.val_fraction(),
            "must be in (0, 1)");
  k.text(!d.dataset().empty() || !d.path().empty(),
         "key 'data.dataset' or 'data.path' must name the training text (both are empty)");

  const auto& t = c.train();
  k.positive("train.batch_size", t.batch_size());
  k.non_negative("train.max_iters", t.max_iters());
  k.non_negative("train.learning_rate", t.learning_rate());
  k.non_negative("train.min_lr", t.min_lr());
  k.non_negative("train.warmup_iters", t.warmup_iters());
  k.non_negative("train.lr_decay_iters", t.lr_decay_iters());
  if (t.decay_lr()) {
    k.require(t.lr_decay_iters() >= t.warmup_iters(), "train.lr_decay_iters", t.lr_decay_iters(),
              "must be >= train.warmup_iters = " + std::to_string(t.warmup_iters()) +
                  " when train.decay_lr is true");
  }
  k.non_negative("train.weight_decay", t.weight_decay());
  k.unit_interval("train.beta1", t.beta1());
  k.unit_interval("train.beta2", t.beta2());
  k.unit_interval("train.momentum", t.momentum());
  k.non_negative("train.grad_clip", t.grad_clip());
  k.positive("train.eval_interval", t.eval_interval());
  k.positive("train.eval_iters", t.eval_iters());
  k.positive("train.log_interval", t.log_interval());
  k.non_negative("train.threads", t.threads());
  k.text(!t.out_dir().empty(), "key 'train.out_dir' must not be empty");

  const auto& s = c.sample();
  k.non_negative("sample.max_new_tokens", s.max_new_tokens());
  k.require(std::isfinite(s.temperature()) && s.temperature() > 0, "sample.temperature",
            s.temperature(), "must be finite and > 0");
  k.non_negative("sample.top_k", s.top_k());
  return k.status();
}

Result<starling::v1::RunConfig> load_run_config(const std::filesystem::path& file) {
  starling::v1::RunConfig config;
  RETURN_IF_ERROR(load_toml(file, &config));
  RETURN_IF_ERROR(validate_run_config(config, file.string()));
  return config;
}

Result<std::ofstream> open_run_dir(const starling::v1::RunConfig& c, std::string_view source) {
  const std::filesystem::path out_dir = c.train().out_dir();
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return invalid_argument(std::string(source) + ": train.out_dir '" + out_dir.string() +
                            "': " + ec.message());
  }
  {
    std::ofstream f(out_dir / "config.toml");
    f << to_toml(c);
    if (!f) return invalid_argument("cannot write " + (out_dir / "config.toml").string());
  }
  std::ofstream metrics(out_dir / "metrics.jsonl", std::ios::trunc);
  if (!metrics) return invalid_argument("cannot write " + (out_dir / "metrics.jsonl").string());
  return metrics;
}

}  // namespace starling::config
