// `starling train` and `starling sample`: the local GPT trainer and text generation.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "apps/starling/commands.h"
#include "core/config/toml_config.h"
#include "core/io/safetensors.h"
#include "models/ddpm/checkpoint.h"
#include "models/ddpm/trainer.h"
#include "models/gpt/checkpoint.h"
#include "models/gpt/trainer.h"
#include "models/mdlm/trainer.h"

namespace starling::apps {

void fail(CommandContext& ctx, const std::string& message) {
  std::fprintf(stderr, "starling: error: %s\n", message.c_str());
  ctx.exit_code = 1;
}

namespace {

// Applies --set KEY=VALUE overrides: each is parsed as the TOML line `KEY = VALUE` (a bare
// word that is not a TOML value is taken as a string) and merged over the file's values.
Status apply_overrides(const std::vector<std::string>& sets, v1::RunConfig* cfg) {
  for (const auto& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) return invalid_argument("--set '" + s + "': expected KEY=VALUE");
    const std::string key = s.substr(0, eq), value = s.substr(eq + 1);
    v1::RunConfig over;
    Status st = config::parse_toml(key + " = " + value, "--set " + s, &over);
    if (!st.ok()) {
      const Status quoted = config::parse_toml(key + " = \"" + value + "\"", "--set " + s, &over);
      if (!quoted.ok()) return st;
    }
    cfg->MergeFrom(over);
  }
  return ok_status();
}

}  // namespace

void register_train(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("train", "Train a model locally from a TOML config");
  auto config_path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  cmd->add_option("-c,--config", *config_path, "TOML config (see configs/)")->required();
  cmd->add_option("--set", *sets,
                  "Override a config key, e.g. --set train.max_iters=500 (repeatable)");
  cmd->callback([&ctx, config_path, sets]() {
    v1::RunConfig cfg;
    if (Status st = config::load_toml(*config_path, &cfg); !st.ok()) return fail(ctx, st.message());
    if (Status st = apply_overrides(*sets, &cfg); !st.ok()) return fail(ctx, st.message());
    if (Status st = config::validate_run_config(cfg, *config_path); !st.ok()) {
      return fail(ctx, st.message());
    }
    if (cfg.model().arch() == v1::ModelConfig::DDPM) {
      auto res = models::train_ddpm(cfg, *config_path);
      if (!res.ok()) return fail(ctx, res.status().message());
      std::printf(
          "trained %lld steps in %.1f s: val loss %.5f (best %.5f, epsilon MSE), %.1f images/s\n",
          static_cast<long long>(res->iters), res->seconds, res->val_loss, res->best_val_loss,
          res->tokens_per_second);
      std::printf("checkpoint: %s\nsamples: %s\n", res->checkpoint.string().c_str(),
                  (res->checkpoint.parent_path() / "samples.png").string().c_str());
      return;
    }
    auto res = cfg.model().arch() == v1::ModelConfig::MDLM ? models::train_mdlm(cfg, *config_path)
                                                           : models::train_gpt(cfg, *config_path);
    if (!res.ok()) return fail(ctx, res.status().message());
    std::printf("trained %lld steps in %.1f s: val loss %.4f (best %.4f), %.0f tokens/s\n",
                static_cast<long long>(res->iters), res->seconds, res->val_loss, res->best_val_loss,
                res->tokens_per_second);
    std::printf("checkpoint: %s\n", res->checkpoint.string().c_str());
  });
}

void register_sample(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a GPT checkpoint");
  struct Opts {
    std::string checkpoint;
    std::string config;
    std::vector<std::string> sets;
    std::string data_dir;
    std::optional<std::string> prompt;
    std::optional<int64_t> max_new_tokens, top_k;
    std::optional<double> temperature;
    std::optional<uint64_t> seed;
    int64_t steps = 0;
    // DDPM checkpoints.
    std::string out_png;
    int64_t num = 0;
    std::optional<std::string> sampler;
    std::optional<double> eta;
    bool classify = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("checkpoint,--checkpoint", o->checkpoint,
                  "safetensors checkpoint (default: <train.out_dir>/ckpt.safetensors of --config, "
                  "else runs/gpt_char_cpu/ckpt.safetensors)");
  cmd->add_option("-c,--config", o->config, "The training config, to find its checkpoint");
  cmd->add_option("--set", o->sets, "Config overrides, as for `starling train`");
  cmd->add_option("--prompt", o->prompt, "Text to continue (default: [sample].prompt)");
  cmd->add_option("-n,--max-new-tokens", o->max_new_tokens, "Tokens to generate");
  cmd->add_option("--temperature", o->temperature, "Softmax temperature");
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: all)");
  cmd->add_option("--seed", o->seed, "Sampling seed");
  cmd->add_option("--steps", o->steps,
                  "Denoising steps of a masked diffusion (MDLM) or DDPM checkpoint (0: the "
                  "config's [diffusion] / [ddpm] steps)");
  cmd->add_option("--data-dir", o->data_dir,
                  "Data directory (GPT-2 tokenizer files; MNIST for --classify)");
  cmd->add_option("--out", o->out_png,
                  "DDPM: PNG sample grid to write (default: samples.png beside the checkpoint)");
  cmd->add_option("--num", o->num, "DDPM: images to sample (0: [ddpm].num_samples)");
  cmd->add_option("--sampler", o->sampler, "DDPM: ddim or ancestral (default: [ddpm].sampler)");
  cmd->add_option("--eta", o->eta, "DDPM: DDIM eta in [0, 1] (default: [ddpm].ddim_eta)");
  cmd->add_flag("--classify", o->classify,
                "DDPM: label the samples with an MNIST classifier trained on the spot; report "
                "mean max-probability and the class histogram");
  cmd->callback([&ctx, o]() {
    std::string ckpt = o->checkpoint;
    if (ckpt.empty() && !o->config.empty()) {
      auto cfg = config::load_run_config(o->config);
      if (!cfg.ok()) return fail(ctx, cfg.status().message());
      if (Status st = apply_overrides(o->sets, &*cfg); !st.ok()) return fail(ctx, st.message());
      ckpt = (std::filesystem::path(cfg->train().out_dir()) / "ckpt.safetensors").string();
    }
    if (ckpt.empty()) ckpt = "runs/gpt_char_cpu/ckpt.safetensors";
    {
      // Masked diffusion checkpoints sample with their own (non-autoregressive) sampler.
      auto file = io::load_safetensors(ckpt);
      if (!file.ok()) return fail(ctx, file.status().message());
      auto it = file->metadata.find("format");
      if (it != file->metadata.end() && models::is_ddpm_format(it->second)) {
        models::DdpmSampleOptions d;
        d.checkpoint = ckpt;
        d.out_png = o->out_png;
        d.num = o->num;
        d.steps = o->steps;
        d.sampler = o->sampler;
        d.eta = o->eta;
        d.seed = o->seed.value_or(1337);
        d.classify = o->classify;
        d.data_dir = o->data_dir;
        auto report = models::sample_ddpm_checkpoint(d);
        if (!report.ok()) return fail(ctx, report.status().message());
        std::cout << *report << std::endl;
        return;
      }
      if (it != file->metadata.end() && it->second == "starling.mdlm.v1") {
        auto text = models::sample_mdlm_checkpoint(ckpt, o->steps, o->temperature.value_or(1.0),
                                                   o->seed.value_or(1337), 1);
        if (!text.ok()) return fail(ctx, text.status().message());
        std::cout << *text << std::endl;
        return;
      }
    }
    auto loaded = models::load_gpt_checkpoint(ckpt, o->data_dir);
    if (!loaded.ok()) return fail(ctx, loaded.status().message());
    const auto& sc = loaded->config.sample();
    const std::string prompt = o->prompt.value_or(sc.prompt());
    auto ids = loaded->tokenizer->encode(prompt);
    if (!ids.ok()) return fail(ctx, "--prompt: " + ids.status().message());
    if (ids->empty()) return fail(ctx, "--prompt must not be empty");
    Rng rng(o->seed.value_or(sc.seed()));
    spdlog::info("sampling from {} (step {}, val loss {:.4f}), seed {}", ckpt, loaded->info.iter,
                 loaded->info.val_loss, o->seed.value_or(sc.seed()));
    const auto out = loaded->model->generate(*ids, o->max_new_tokens.value_or(sc.max_new_tokens()),
                                             o->temperature.value_or(sc.temperature()),
                                             o->top_k.value_or(sc.top_k()), rng);
    auto text = loaded->tokenizer->decode(out);
    if (!text.ok()) return fail(ctx, text.status().message());
    std::cout << *text << std::endl;
  });
}

}  // namespace starling::apps
