// `starling train` and `starling sample`: the local GPT trainer and text generation.
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "apps/starling/commands.h"
#include "core/autograd/autograd.h"
#include "core/comm/data_parallel.h"
#include "core/comm/run_ranks.h"
#include "core/config/toml_config.h"
#include "core/cuda/device.h"
#include "core/cuda/tensor_backend.h"
#include "core/data/data_dir.h"
#include "core/data/text_dataset.h"
#include "core/data/text_file.h"
#include "core/io/safetensors.h"
#include "core/optim/optimizer.h"
#include "core/util/memory.h"
#include "models/ddpm/checkpoint.h"
#include "models/ddpm/trainer.h"
#include "models/gpt/checkpoint.h"
#include "models/gpt/fused_trainer.h"
#include "models/gpt/gpt.h"
#include "models/gpt/trainer.h"
#include "models/mdlm/checkpoint.h"
#include "models/mdlm/fused_engine.h"
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

// The checkpoint `starling sample` / `eval` read: `explicit_path` if given, else
// <train.out_dir>/ckpt.safetensors of `config_path` with `sets` applied, else "".
Result<std::string> checkpoint_path(const std::string& explicit_path,
                                    const std::string& config_path,
                                    const std::vector<std::string>& sets) {
  if (!explicit_path.empty() || config_path.empty()) return explicit_path;
  ASSIGN_OR_RETURN(v1::RunConfig cfg, config::load_run_config(config_path));
  RETURN_IF_ERROR(apply_overrides(sets, &cfg));
  return (std::filesystem::path(cfg.train().out_dir()) / "ckpt.safetensors").string();
}

// `starling train --ranks N`: the GPT loop of models::train_gpt (same data, schedule, clipping,
// evaluation, outputs), run by N ranks on N threads with comm::DataParallel. Each rank holds a
// replica, draws batch_size / N rows per step from its own sampler stream and averages
// gradients with the others in buckets during backward; rank 0 evaluates, logs and checkpoints.
struct RanksOptions {
  int ranks = 1;
  double bucket_mb = 25.0;
  bool overlap = true;
};

Result<models::TrainSummary> train_gpt_ranks(const v1::RunConfig& cfg, const std::string& source,
                                             const RanksOptions& ro) {
  using Clock = std::chrono::steady_clock;
  const auto& tc = cfg.train();
  const int n = ro.ranks;
  if (cfg.model().arch() != v1::ModelConfig::GPT) {
    return invalid_argument(source + ": --ranks " + std::to_string(n) +
                            " supports model.arch = gpt only");
  }
  if (tc.batch_size() % n != 0) {
    return invalid_argument(source + ": train.batch_size " + std::to_string(tc.batch_size()) +
                            " is not a multiple of --ranks " + std::to_string(n) +
                            " (each rank takes batch_size / ranks rows)");
  }
  if (!(ro.bucket_mb > 0)) return invalid_argument("--bucket-mb must be positive");
  if (!cfg.model().init_from().empty() || cfg.lora().rank() > 0) {
    return unimplemented(source + ": --ranks " + std::to_string(n) +
                         " trains from scratch; model.init_from and [lora] run without --ranks");
  }

  ASSIGN_OR_RETURN(models::TextData text_data, models::load_text_data(cfg, source));
  const data::TextDataset& ds = text_data.dataset;
  const std::shared_ptr<const data::Tokenizer>& tokenizer = text_data.tokenizer;
  models::GptConfig gc = models::GptConfig::from_proto(cfg.model(), tokenizer->vocab_size());
  RETURN_IF_ERROR(gc.validate(), source);
  if (gc.vocab_size < tokenizer->vocab_size()) {
    return invalid_argument(source + ": model.vocab_size " + std::to_string(gc.vocab_size) +
                            " is smaller than the tokenizer's " +
                            std::to_string(tokenizer->vocab_size()));
  }

  const std::filesystem::path out_dir = tc.out_dir();
  ASSIGN_OR_RETURN(std::ofstream metrics, config::open_run_dir(cfg, source));

  const int total_threads = tc.threads() > 0 ? tc.threads() : omp_get_max_threads();
  const int rank_threads = std::max(1, total_threads / n);
  const int64_t b = tc.batch_size() / n, t = gc.block_size;
  const int64_t max_iters = tc.max_iters();
  const optim::CosineSchedule sched{tc.learning_rate(), tc.min_lr(), tc.warmup_iters(),
                                    tc.lr_decay_iters()};
  comm::DataParallelOptions dpo;
  dpo.bucket_bytes = static_cast<size_t>(ro.bucket_mb * 1024 * 1024);
  dpo.overlap = ro.overlap;

  models::TrainSummary sum;
  sum.best_val_loss = 1e30;
  sum.checkpoint = out_dir / "ckpt.safetensors";
  const auto t0 = Clock::now();
  double train_seconds = 0.0;

  // A generous collective timeout: rank 0 evaluates and checkpoints while the others wait.
  const auto statuses = comm::run_ranks(n, std::chrono::minutes(10), [&](comm::Communicator& c) {
    const int r = c.rank();
    omp_set_num_threads(rank_threads);
    // Own seed per rank for dropout; rank 0's weights are broadcast to every rank.
    models::Gpt model(gc, tc.seed() + static_cast<uint64_t>(r));
    ASSIGN_OR_RETURN(auto dp, comm::DataParallel::make(model.named_parameters(), c, dpo));
    if (r == 0) {
      spdlog::info(
          "model: GPT L={} H={} C={} T={} V={}, {:.2f}M parameters, seed {}; data parallel: {} "
          "ranks x {} rows, {} buckets (cap {} MB), overlap {}, {} threads per rank",
          gc.n_layer, gc.n_head, gc.n_embd, gc.block_size, gc.vocab_size,
          static_cast<double>(model.num_parameters()) / 1e6, tc.seed(), n, b,
          dp->bucket_params().size(), ro.bucket_mb, ro.overlap ? "on" : "off", rank_threads);
    }
    std::unique_ptr<optim::Optimizer> opt = models::make_optimizer(model.parameters(), tc);
    Rng batch_rng = Rng(tc.seed() + 1).fork(static_cast<uint64_t>(r));
    Rng eval_rng(tc.seed() + 2);
    int64_t window_tokens = 0;
    double window_seconds = 0.0;
    for (int64_t it = 0; it <= max_iters; ++it) {
      const double lr = tc.decay_lr() ? sched.at(it) : tc.learning_rate();
      const bool eval_now =
          (tc.eval_interval() > 0 && it % tc.eval_interval() == 0) || it == max_iters;
      if (r == 0 && eval_now) {
        autograd::NoGradGuard ng;
        model.train(false);
        double losses[2] = {0, 0};
        const int ne = std::max(1, tc.eval_iters());
        for (int s = 0; s < 2; ++s) {
          for (int i = 0; i < ne; ++i) {
            ASSIGN_OR_RETURN(data::Batch eb,
                             ds.get_batch(s == 0 ? data::Split::kTrain : data::Split::kVal,
                                          tc.batch_size(), t, eval_rng));
            losses[s] += model.loss(eb.x, eb.y).item();
          }
          losses[s] /= ne;
        }
        model.train(true);
        sum.train_loss = losses[0];
        sum.val_loss = losses[1];
        spdlog::info("step {}: train loss {:.4f}, val loss {:.4f}", it, losses[0], losses[1]);
        metrics << "{\"event\":\"eval\",\"iter\":" << it << ",\"train_loss\":" << losses[0]
                << ",\"val_loss\":" << losses[1] << "}\n";
        metrics.flush();
        const models::GptCheckpointInfo info{it, losses[0], losses[1]};
        if (it > 0 && losses[1] < sum.best_val_loss) {
          sum.best_val_loss = losses[1];
          RETURN_IF_ERROR(models::save_gpt_checkpoint(out_dir / "best.safetensors", model, cfg,
                                                      *tokenizer, info));
        }
        RETURN_IF_ERROR(models::save_gpt_checkpoint(sum.checkpoint, model, cfg, *tokenizer, info));
      }
      if (it == max_iters) break;

      const auto s0 = Clock::now();
      ASSIGN_OR_RETURN(data::Batch batch, ds.get_batch(data::Split::kTrain, b, t, batch_rng),
                       "rank " + std::to_string(r));
      Tensor loss = model.loss(batch.x, batch.y);
      std::vector<float> loss_v{static_cast<float>(loss.item())};
      if (!std::isfinite(loss_v[0])) {
        return internal_error("rank " + std::to_string(r) + ": training diverged at step " +
                              std::to_string(it) + ": loss is " + std::to_string(loss_v[0]) +
                              " (lower train.learning_rate?)");
      }
      RETURN_IF_ERROR(dp->backward(loss), "step " + std::to_string(it));
      RETURN_IF_ERROR(c.all_reduce(loss_v, comm::ReduceOp::kAvg), "step " + std::to_string(it));
      const double gnorm = optim::clip_grad_norm(model.parameters(), tc.grad_clip());
      opt->step(lr);
      opt->zero_grad();
      if (r != 0) continue;
      const double step_seconds = std::chrono::duration<double>(Clock::now() - s0).count();
      train_seconds += step_seconds;
      window_seconds += step_seconds;
      window_tokens += tc.batch_size() * t;
      sum.iters = it + 1;
      if (tc.log_interval() > 0 && (it % tc.log_interval() == 0 || it + 1 == max_iters)) {
        const double tps =
            window_seconds > 0 ? static_cast<double>(window_tokens) / window_seconds : 0.0;
        spdlog::info("step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s", it,
                     max_iters, loss_v[0], lr, gnorm, tps);
        metrics << "{\"event\":\"train\",\"iter\":" << it << ",\"loss\":" << loss_v[0]
                << ",\"lr\":" << lr << ",\"grad_norm\":" << gnorm << ",\"tokens_per_s\":" << tps
                << ",\"ranks\":" << n << "}\n";
        window_seconds = 0.0;
        window_tokens = 0;
      }
    }
    return ok_status();
  });
  RETURN_IF_ERROR(comm::first_error(statuses), source + ": --ranks " + std::to_string(n));
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_second = train_seconds > 0
                              ? static_cast<double>(sum.iters * tc.batch_size() * t) / train_seconds
                              : 0.0;
  return sum;
}

// --device cuda / --gpus: the GPUs to train on (the fused GPT / MDLM trainer; several: data
// parallel, one rank per GPU over NCCL), or none for the CPU. Refused with the reason, never
// silently run on the CPU: a build without CUDA, no visible GPU, an index that is not a visible
// GPU, a GPU named twice.
Result<std::vector<int>> check_gpu_request(const std::string& device, const std::string& gpus) {
  if (device != "cpu" && device != "cuda") {
    return invalid_argument("--device '" + device + "': expected cpu or cuda");
  }
  if (device == "cpu" && gpus.empty()) return std::vector<int>();
  const std::string what = gpus.empty() ? "--device cuda" : "--gpus " + gpus;
  std::vector<int> ids;
  for (size_t pos = 0; !gpus.empty() && pos <= gpus.size();) {
    const size_t comma = std::min(gpus.find(',', pos), gpus.size());
    const std::string item = gpus.substr(pos, comma - pos);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
        item.size() > 4) {
      return invalid_argument("--gpus '" + gpus + "': expected GPU indices like 0 or 0,1");
    }
    const int id = std::stoi(item);
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
      return invalid_argument("--gpus '" + gpus + "': GPU " + item +
                              " is named twice (one rank per GPU)");
    }
    ids.push_back(id);
    pos = comma + 1;
  }
  if (ids.empty()) ids.push_back(0);
  if (!cuda::built_with_cuda()) {
    return unimplemented(what +
                         ": this starling build has no CUDA backend, so no GPU training path "
                         "(configure with `cmake --preset cuda` on a machine with the CUDA "
                         "toolkit); without it the config trains on the CPU (GPT and MDLM: "
                         "train.engine = \"fused\" is the GPU's trainer on the CPU)");
  }
  const auto devs = cuda::devices();
  if (devs.empty()) {
    return failed_precondition(what +
                               ": no CUDA device is visible, so no GPU training path on this "
                               "machine (driver, CUDA_VISIBLE_DEVICES?); without it the config "
                               "trains on the CPU (GPT and MDLM: train.engine = \"fused\" is the "
                               "GPU's trainer on the CPU)");
  }
  for (int gpu : ids) {
    if (gpu >= static_cast<int>(devs.size())) {
      return invalid_argument(what + ": GPU " + std::to_string(gpu) + " is not visible (" +
                              std::to_string(devs.size()) + " visible)");
    }
  }
  return ids;
}

}  // namespace

void register_train(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand("train", "Train a model locally from a TOML config");
  auto config_path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  cmd->add_option("-c,--config", *config_path, "TOML config (see configs/)")->required();
  cmd->add_option("--set", *sets,
                  "Override a config key, e.g. --set train.max_iters=500 (repeatable)");
  auto ranks = std::make_shared<RanksOptions>();
  auto device = std::make_shared<std::string>("cpu");
  auto gpus = std::make_shared<std::string>();
  cmd->add_option("--ranks", ranks->ranks,
                  "Data-parallel ranks on CPU threads (GPT, autograd or fused engine): each takes "
                  "batch_size / ranks rows, gradients are averaged during backward; rank 0 logs "
                  "and checkpoints")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--bucket-mb", ranks->bucket_mb,
                  "With --ranks: gradient bucket cap in MB (default 25, as PyTorch DDP)");
  cmd->add_flag("!--no-overlap", ranks->overlap,
                "With --ranks: all-reduce after backward instead of during it");
  cmd->add_option("--device", *device,
                  "cpu (default) or cuda: GPT and MDLM configs train with the fused engine on the "
                  "GPU, DDPM configs with cuDNN convolutions");
  cmd->add_option("--gpus", *gpus,
                  "GPUs to train on (implies --device cuda), e.g. 0, or 0,1 for data parallel "
                  "with one rank per GPU over NCCL (GPT)");
  cmd->callback([&ctx, config_path, sets, ranks, device, gpus]() {
    util::keep_freed_memory();  // a step reuses its buffers instead of faulting them in
    auto gpu = check_gpu_request(*device, *gpus);
    if (!gpu.ok()) return fail(ctx, gpu.status().message());
    v1::RunConfig cfg;
    if (Status st = config::load_toml(*config_path, &cfg); !st.ok()) return fail(ctx, st.message());
    if (Status st = apply_overrides(*sets, &cfg); !st.ok()) return fail(ctx, st.message());
    if (Status st = config::validate_run_config(cfg, *config_path); !st.ok()) {
      return fail(ctx, st.message());
    }
    // The DDPM on a GPU: the autograd engine with the ops' CUDA forms (cuDNN convolutions).
    if (!gpu->empty() && cfg.model().arch() == v1::ModelConfig::DDPM) {
      if (gpu->size() > 1 || ranks->ranks > 1) {
        return fail(ctx, *config_path + ": the DDPM trains on one GPU (--device cuda or --gpus N)");
      }
      if (cfg.train().precision() == v1::TrainConfig::BF16) {
        return fail(
            ctx, *config_path + ": train.precision = \"bf16\": the DDPM trains in fp32 on the GPU");
      }
      if (Status st = cuda::install_tensor_backend(); !st.ok()) return fail(ctx, st.message());
      const Device dev = Device::cuda(gpu->front());
      auto res = models::train_ddpm(cfg, *config_path, dev);
      if (!res.ok()) return fail(ctx, res.status().message());
      std::printf(
          "trained %lld steps in %.1f s: val loss %.5f (best %.5f, epsilon MSE), %.1f images/s "
          "(%s)\n",
          static_cast<long long>(res->iters), res->seconds, res->val_loss, res->best_val_loss,
          res->tokens_per_second, device_str(dev).c_str());
      std::printf("checkpoint: %s\nsamples: %s\n", res->checkpoint.string().c_str(),
                  (res->checkpoint.parent_path() / "samples.png").string().c_str());
      return;
    }
    // The fused engine (GPT, or the plain MDLM): on the GPU (--device cuda / --gpus) or on the
    // CPU (train.engine).
    if (!gpu->empty() || cfg.train().engine() == v1::TrainConfig::FUSED) {
      const bool on_gpu = !gpu->empty();
      const std::string what = on_gpu ? "--device cuda" : std::string("train.engine = \"fused\"");
      if (on_gpu && ranks->ranks > 1) {
        return fail(ctx, "--ranks " + std::to_string(ranks->ranks) +
                             " runs ranks on CPU threads; on GPUs --gpus names the ranks, one "
                             "per GPU (e.g. --gpus 0,1)");
      }
      const bool mdlm = cfg.model().arch() == v1::ModelConfig::MDLM;
      if (cfg.model().arch() != v1::ModelConfig::GPT && !mdlm) {
        return fail(ctx, *config_path + ": " + what +
                             " trains model.arch = \"gpt\" and \"mdlm\" (the fused trainer); the "
                             "DDPM trains with train.engine = \"autograd\" (on a GPU: --device "
                             "cuda)");
      }
      models::FusedTrainOptions fo;
      fo.cuda = on_gpu;
      fo.gpu = on_gpu ? gpu->front() : 0;
      if (gpu->size() > 1) fo.gpus = *gpu;
      fo.ranks = on_gpu ? 1 : ranks->ranks;
      fo.overlap = ranks->overlap;
      const int n = on_gpu ? static_cast<int>(gpu->size()) : ranks->ranks;
      if (mdlm && n > 1) {
        return fail(ctx, *config_path + ": data parallel (" +
                             (on_gpu ? "--gpus " + *gpus : "--ranks " + std::to_string(n)) +
                             ") trains model.arch = \"gpt\"; the MDLM trains on one replica");
      }
      auto res = mdlm ? models::train_mdlm_fused(cfg, *config_path, fo)
                      : models::train_gpt_fused(cfg, *config_path, fo);
      if (!res.ok()) return fail(ctx, res.status().message());
      std::string where = on_gpu ? "fused, cuda:" : "fused, cpu";
      for (size_t i = 0; on_gpu && i < gpu->size(); ++i) {
        where += (i ? "," : "") + std::to_string((*gpu)[i]);
      }
      if (n > 1) where += ", " + std::to_string(n) + " ranks";
      std::printf("trained %lld steps in %.1f s: val loss %.4f (best %.4f), %.0f tokens/s (%s)\n",
                  static_cast<long long>(res->iters), res->seconds, res->val_loss,
                  res->best_val_loss, res->tokens_per_second, where.c_str());
      std::printf("checkpoint: %s\n", res->checkpoint.string().c_str());
      return;
    }
    // Past this point every engine is fp32 (autograd GPT, ranks, MDLM, DDPM).
    if (cfg.train().precision() == v1::TrainConfig::BF16) {
      return fail(ctx, *config_path +
                           ": train.precision = \"bf16\" runs on the fused GPT engine "
                           "(train.engine = \"fused\", or --device cuda); this run's engine is "
                           "fp32 only");
    }
    if (ranks->ranks > 1) {
      auto res = train_gpt_ranks(cfg, *config_path, *ranks);
      if (!res.ok()) return fail(ctx, res.status().message());
      std::printf(
          "trained %lld steps on %d ranks in %.1f s: val loss %.4f (best %.4f), %.0f "
          "tokens/s\n",
          static_cast<long long>(res->iters), ranks->ranks, res->seconds, res->val_loss,
          res->best_val_loss, res->tokens_per_second);
      std::printf("checkpoint: %s\n", res->checkpoint.string().c_str());
      return;
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
    bool no_kv_cache = false;
    std::string device = "cpu";
    int gpu = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("checkpoint,--checkpoint", o->checkpoint,
                  "safetensors checkpoint (default: <train.out_dir>/ckpt.safetensors of --config, "
                  "else runs/gpt_char_cpu/ckpt.safetensors)");
  cmd->add_flag("--no-kv-cache", o->no_kv_cache,
                "GPT and block-diffusion MDLM: recompute the whole context every step instead of "
                "keeping each layer's keys and values (default: [sample].kv_cache, true)");
  cmd->add_option("-c,--config", o->config, "The training config, to find its checkpoint");
  cmd->add_option("--set", o->sets,
                  "Config overrides, as for `starling train` (sample.KEY=VALUE also overrides the "
                  "checkpoint's [sample])");
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
  cmd->add_option("--device", o->device, "DDPM: cpu (default) or cuda (the U-Net on a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpu", o->gpu, "The GPU of --device cuda")->check(CLI::NonNegativeNumber);
  cmd->callback([&ctx, o]() {
    auto found = checkpoint_path(o->checkpoint, o->config, o->sets);
    if (!found.ok()) return fail(ctx, found.status().message());
    std::string ckpt = *found;
    if (ckpt.empty()) ckpt = "runs/gpt_char_cpu/ckpt.safetensors";
    // --set sample.KEY=VALUE also overrides the [sample] stored in the checkpoint.
    std::vector<std::string> sample_sets;
    for (const auto& s : o->sets) {
      if (s.rfind("sample.", 0) == 0) sample_sets.push_back(s);
    }
    v1::RunConfig sample_over;
    if (Status st = apply_overrides(sample_sets, &sample_over); !st.ok()) {
      return fail(ctx, st.message());
    }
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
        if (o->device == "cuda") {
          auto gpu = check_gpu_request("cuda", std::to_string(o->gpu));
          if (!gpu.ok()) return fail(ctx, gpu.status().message());
          if (Status st = cuda::install_tensor_backend(); !st.ok()) return fail(ctx, st.message());
          d.device = Device::cuda(o->gpu);
        }
        auto report = models::sample_ddpm_checkpoint(d);
        if (!report.ok()) return fail(ctx, report.status().message());
        std::cout << *report << std::endl;
        return;
      }
      if (o->device != "cpu") {
        return fail(ctx, ckpt + ": --device " + o->device +
                             " samples DDPM checkpoints; GPT and MDLM checkpoints sample on the "
                             "CPU (starling eval --device cuda scores them on a GPU)");
      }
      if (it != file->metadata.end() && it->second == "starling.mdlm.v1") {
        std::optional<bool> kv;
        if (sample_over.sample().has_kv_cache()) kv = sample_over.sample().kv_cache();
        if (o->no_kv_cache) kv = false;
        auto text = models::sample_mdlm_checkpoint(ckpt, o->steps, o->temperature.value_or(1.0),
                                                   o->seed.value_or(1337), 1, kv);
        if (!text.ok()) return fail(ctx, text.status().message());
        std::cout << *text << std::endl;
        return;
      }
    }
    auto loaded = models::load_gpt_checkpoint(ckpt, o->data_dir);
    if (!loaded.ok()) return fail(ctx, loaded.status().message());
    loaded->config.mutable_sample()->MergeFrom(sample_over.sample());
    const auto& sc = loaded->config.sample();
    const std::string prompt = o->prompt.value_or(sc.prompt());
    auto ids = loaded->tokenizer->encode(prompt);
    if (!ids.ok()) return fail(ctx, "--prompt: " + ids.status().message());
    if (ids->empty()) return fail(ctx, "--prompt must not be empty");
    Rng rng(o->seed.value_or(sc.seed()));
    spdlog::info("sampling from {} (step {}, val loss {:.4f}), seed {}", ckpt, loaded->info.iter,
                 loaded->info.val_loss, o->seed.value_or(sc.seed()));
    const bool kv = sc.kv_cache() && !o->no_kv_cache;
    const int64_t max_new = o->max_new_tokens.value_or(sc.max_new_tokens());
    const auto t0 = std::chrono::steady_clock::now();
    const auto out =
        loaded->model->generate(*ids, max_new, o->temperature.value_or(sc.temperature()),
                                o->top_k.value_or(sc.top_k()), rng, kv);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("generated {} tokens in {:.3f} s, {:.1f} tokens/s (kv cache {})", max_new, secs,
                 static_cast<double>(max_new) / std::max(secs, 1e-9), kv ? "on" : "off");
    auto text = loaded->tokenizer->decode(out);
    if (!text.ok()) return fail(ctx, text.status().message());
    std::cout << *text << std::endl;
  });
}

void register_eval(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "eval", "Loss of a GPT or MDLM checkpoint over a whole split of its training data");
  struct Opts {
    std::string checkpoint;
    std::string config;
    std::string split = "val";
    int64_t batch = 0;
    std::optional<uint64_t> seed;
    std::optional<std::string> masking;
    std::string data_dir;
    std::vector<std::string> sets;
    std::string engine = "autograd";
    std::string device = "cpu";
    int gpu = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("checkpoint,--checkpoint", o->checkpoint,
                  "safetensors checkpoint (default: <train.out_dir>/ckpt.safetensors of --config)");
  cmd->add_option("--engine", o->engine,
                  "autograd, or fused (the fused engine's forward: the same loss, faster)")
      ->check(CLI::IsMember({"autograd", "fused"}));
  cmd->add_option("--device", o->device, "cpu, or cuda (the fused engine on a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpu", o->gpu, "The GPU of --device cuda")->check(CLI::NonNegativeNumber);
  cmd->add_option("-c,--config", o->config, "The training config, to find its checkpoint");
  cmd->add_option("--set", o->sets, "Config overrides, as for `starling train`");
  cmd->add_option("--split", o->split, "val or train")->check(CLI::IsMember({"val", "train"}));
  cmd->add_option("--batch", o->batch, "Windows per forward pass (0: train.batch_size)");
  cmd->add_option("--seed", o->seed, "MDLM: seed of the times and masks (default: the fixed one)");
  cmd->add_option("--masking", o->masking,
                  "MDLM: bound estimator, bernoulli or count (default: [diffusion].masking)")
      ->check(CLI::IsMember({"bernoulli", "count"}));
  cmd->add_option("--data-dir", o->data_dir, "Data directory (default: the checkpoint config's)");
  cmd->callback([&ctx, o]() {
    auto found = checkpoint_path(o->checkpoint, o->config, o->sets);
    if (!found.ok()) return fail(ctx, found.status().message());
    const std::string ckpt = *found;
    if (ckpt.empty()) return fail(ctx, "eval: give a checkpoint or --config");
    auto file = io::load_safetensors(ckpt);
    if (!file.ok()) return fail(ctx, file.status().message());
    const auto fmt = file->metadata.find("format");
    const bool mdlm = fmt != file->metadata.end() && fmt->second == "starling.mdlm.v1";
    if (fmt != file->metadata.end() && models::is_ddpm_format(fmt->second)) {
      return fail(ctx, ckpt +
                           ": eval reads GPT and MDLM checkpoints; for a DDPM use `starling "
                           "sample --classify`");
    }
    // The checkpoint's own config names the data. A GPT's text goes through the checkpoint's
    // tokenizer (`use`: a fine-tuned model keeps its base's vocabulary); otherwise the one
    // rebuilt here must be the checkpoint's.
    auto with_data = [&](v1::RunConfig cfg, const data::Tokenizer& tok,
                         std::shared_ptr<const data::Tokenizer> use =
                             nullptr) -> Result<models::TextData> {
      if (!o->data_dir.empty()) cfg.mutable_data()->set_data_dir(o->data_dir);
      ASSIGN_OR_RETURN(models::TextData text, models::load_text_data(cfg, ckpt, std::move(use)));
      if (text.tokenizer->vocab_size() != tok.vocab_size()) {
        return failed_precondition(
            ckpt + ": the data's tokenizer has " + std::to_string(text.tokenizer->vocab_size()) +
            " tokens, the checkpoint's " + std::to_string(tok.vocab_size()) + " (another corpus?)");
      }
      return text;
    };
    const auto split = o->split == "train" ? data::Split::kTrain : data::Split::kVal;
    constexpr double kLn2 = 0.69314718055994530942;
    // --device cuda runs the fused engine (one forward per batch, only the loss comes back).
    const bool cuda = o->device == "cuda";
    const bool fused = cuda || o->engine == "fused";
    std::string where = "autograd engine, cpu";
    auto backend = [&]() -> Result<std::unique_ptr<models::FusedBackend>> {
      if (!cuda) return models::make_fused_cpu_backend();
      return models::make_fused_cuda_backend(o->gpu);
    };
    if (mdlm) {
      auto loaded = models::load_mdlm_checkpoint(ckpt, o->data_dir);
      if (!loaded.ok()) return fail(ctx, loaded.status().message());
      auto text = with_data(loaded->config, *loaded->tokenizer);
      if (!text.ok()) return fail(ctx, text.status().message());
      const int64_t len = loaded->model->config().block_size;
      const auto tokens = text->dataset.tokens(split);
      if (static_cast<int64_t>(tokens.size()) < len) {
        return fail(ctx, ckpt + ": the " + o->split + " split is shorter than block_size");
      }
      std::optional<models::MaskSampling> masking;
      if (o->masking) {
        masking = *o->masking == "count" ? models::MaskSampling::kCount
                                         : models::MaskSampling::kBernoulli;
      }
      const models::MaskSampling used = masking.value_or(loaded->model->config().masking);
      const int64_t b = o->batch > 0 ? o->batch : loaded->config.train().batch_size();
      double nelbo = 0.0;
      if (fused) {
        // The same windows, times and masks (the host model draws them); the trunk's forward on
        // the fused engine gives each batch's bound.
        auto k = backend();
        if (!k.ok()) return fail(ctx, "--device " + o->device + ": " + k.status().message());
        where = "fused engine, " + (*k)->name();
        auto engine = models::FusedMdlm::make(loaded->model->config(), b, 0, std::move(*k));
        if (!engine.ok()) return fail(ctx, ckpt + ": " + engine.status().message());
        if (Status st = (*engine)->load(loaded->model->state_dict()); !st.ok()) {
          return fail(ctx, ckpt + ": " + st.message());
        }
        auto r = models::mdlm_eval_full(
            *loaded->model, tokens, b,
            [&](const Tensor& x0, std::span<const double> t, const Tensor& xt) {
              return (*engine)->loss(x0, t, xt);
            },
            o->seed, masking);
        if (!r.ok()) return fail(ctx, r.status().message());
        nelbo = *r;
      } else {
        nelbo = models::mdlm_eval_full(*loaded->model, tokens, b, o->seed, masking);
      }
      std::printf(
          "%s: %lld windows of %lld tokens, %.4f nats/token, %.4f bits/token (NELBO bound, %s "
          "estimator; %s)\n",
          o->split.c_str(), static_cast<long long>(static_cast<int64_t>(tokens.size()) / len),
          static_cast<long long>(len), nelbo, nelbo / kLn2,
          used == models::MaskSampling::kCount ? "count" : "bernoulli", where.c_str());
      return;
    }
    auto loaded = models::load_gpt_checkpoint(ckpt, o->data_dir);
    if (!loaded.ok()) return fail(ctx, loaded.status().message());
    std::shared_ptr<const data::Tokenizer> tokenizer = std::move(loaded->tokenizer);
    auto text = with_data(loaded->config, *tokenizer, tokenizer);
    if (!text.ok()) return fail(ctx, text.status().message());
    const int64_t len = loaded->model->config().block_size;
    const int64_t b = o->batch > 0 ? o->batch : loaded->config.train().batch_size();
    models::Gpt& model = *loaded->model;
    model.train(false);
    autograd::NoGradGuard ng;
    std::unique_ptr<models::FusedGpt> engine;
    if (fused) {
      auto k = backend();
      if (!k.ok()) return fail(ctx, "--device " + o->device + ": " + k.status().message());
      where = "fused engine, " + (*k)->name();
      auto e = models::FusedGpt::make(model.config(), b, len, 0, std::move(*k));
      if (!e.ok()) return fail(ctx, ckpt + ": " + e.status().message());
      if (Status st = (*e)->load(model.state_dict()); !st.ok()) {
        return fail(ctx, ckpt + ": " + st.message());
      }
      engine = std::move(*e);
    }
    auto full = models::full_split_loss(
        text->dataset.tokens(split), b, len, [&](const data::Batch& batch) -> Result<double> {
          if (engine) {
            return engine->loss(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                                static_cast<size_t>(batch.x.numel()));
          }
          return model.loss(batch.x, batch.y).item();
        });
    if (!full.ok()) return fail(ctx, full.status().message());
    if (full->second == 0) {
      return fail(ctx, ckpt + ": the " + o->split + " split has fewer than --batch windows");
    }
    std::printf(
        "%s: %lld windows of %lld tokens, %.4f nats/token, %.4f bits/token, perplexity %.3f "
        "(next-token loss; %s)\n",
        o->split.c_str(), static_cast<long long>(full->second), static_cast<long long>(len),
        full->first, full->first / kLn2, std::exp(full->first), where.c_str());
  });
}

}  // namespace starling::apps
