// Federation configs and the MNIST task.
#include "aggregator/fed_task.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/compress/spec.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/secagg/quantize.h"
#include "edge_client/ddpm_trainer.h"
#include "edge_client/mdlm_trainer.h"

namespace starling::aggregator {

Result<v1::FederationConfig> load_federation_config(const std::filesystem::path& file) {
  v1::FederationConfig config;
  RETURN_IF_ERROR(config::load_toml(file, &config));
  RETURN_IF_ERROR(validate_federation_config(config, file.string()));
  return config;
}

namespace {

// [model] of MDLM and DDPM: the model's own validation, its keys named under [model]; the local
// optimizer fields apply to them only.
template <typename Check>
void validate_diffusion_model(const v1::FederationConfig& c, Check& check) {
  const auto arch = c.model().arch();
  const bool diffusion = arch == v1::FedModelConfig::MDLM || arch == v1::FedModelConfig::DDPM;
  auto model_status = [&](const Status& st) {
    if (st.ok()) return;
    std::string m = st.message();
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"'ddpm.", "'model.ddpm."},
                                   {"diffusion.eps", "model.diffusion.eps"}}) {
      for (size_t at = m.find(from); at != std::string::npos; at = m.find(from, at + to.size())) {
        m.replace(at, from.size(), to);
      }
    }
    check(false, arch == v1::FedModelConfig::DDPM ? "model.ddpm" : "model.diffusion",
          ("is invalid: " + m).c_str());
  };
  if (arch == v1::FedModelConfig::MDLM) {
    model_status(edge_client::mdlm_trainer_options(c, 2).model.validate());
  }
  if (arch == v1::FedModelConfig::DDPM) {
    check(c.data().dataset() == "mnist" || c.data().dataset() == "fashion-mnist", "data.dataset",
          "must be mnist or fashion-mnist for model.arch DDPM");
    model_status(edge_client::ddpm_trainer_options(c).model.validate());
  }
  if (!diffusion) {
    check(c.model().local_optimizer() == v1::FedModelConfig::SGD || arch == v1::FedModelConfig::GPT,
          "model.local_optimizer", "applies to model.arch GPT, MDLM and DDPM only");
    check(!c.model().has_diffusion(), "model.diffusion", "applies to model.arch MDLM only");
    check(!c.model().has_ddpm(), "model.ddpm", "applies to model.arch DDPM only");
  } else {
    check(arch == v1::FedModelConfig::MDLM || !c.model().has_diffusion(), "model.diffusion",
          "applies to model.arch MDLM only");
    check(arch == v1::FedModelConfig::DDPM || !c.model().has_ddpm(), "model.ddpm",
          "applies to model.arch DDPM only");
  }
  if (c.model().local_optimizer() == v1::FedModelConfig::ADAMW) {
    check(c.local().prox_mu() == 0, "local.prox_mu",
          "must be 0 with model.local_optimizer ADAMW (the proximal term is SGD's)");
    check(c.model().adamw_beta1() >= 0 && c.model().adamw_beta1() < 1, "model.adamw_beta1",
          "must be in [0, 1)");
    check(c.model().adamw_beta2() >= 0 && c.model().adamw_beta2() < 1, "model.adamw_beta2",
          "must be in [0, 1)");
    check(c.model().adamw_weight_decay() >= 0, "model.adamw_weight_decay", "must be >= 0");
  }
  if (diffusion) check(c.model().grad_clip() >= 0, "model.grad_clip", "must be >= 0");
}

}  // namespace

Status validate_federation_config(const v1::FederationConfig& c, std::string_view source) {
  std::string errors;
  auto check = [&](bool ok, const char* key, const char* what) {
    if (!ok) errors += "\n  " + std::string(source) + ": key '" + key + "' " + what;
  };
  check(c.rounds().num_rounds() > 0, "rounds.num_rounds", "must be positive");
  check(c.rounds().fraction() >= 0 && c.rounds().fraction() <= 1, "rounds.fraction",
        "must be in [0, 1]");
  check(c.rounds().over_selection() >= 0, "rounds.over_selection", "must be >= 0");
  check(c.rounds().round_deadline_ms() > 0, "rounds.round_deadline_ms", "must be positive");
  check(c.strategy().server_lr() > 0, "strategy.server_lr", "must be positive");
  check(c.strategy().tau() > 0, "strategy.tau", "must be positive");
  check(c.local().batch_size() > 0, "local.batch_size", "must be positive");
  check(c.local().learning_rate() > 0, "local.learning_rate", "must be positive");
  check(c.local().local_steps() > 0 || c.local().epochs() > 0, "local.epochs",
        "must be positive when local.local_steps is 0");
  check(c.local().prox_mu() >= 0, "local.prox_mu", "must be >= 0");
  if (auto cs = compress::parse_compression_spec(c.local().codec()); !cs.ok()) {
    check(false, "local.codec",
          (cs.status().message() + " (e.g. \"topk:ratio=0.01,ef=1;*.bias=identity\")").c_str());
  }
  check(c.client().chunk_kb() >= 1 && c.client().chunk_kb() <= 16 * 1024 - 1, "client.chunk_kb",
        "must be in [1, 16383] (a chunk and its framing must fit one 16 MiB frame)");
  check(c.simulate().connect_timeout_s() > 0, "simulate.connect_timeout_s", "must be positive");
  check(c.data().num_clients() > 0, "data.num_clients", "must be positive");
  check(c.data().alpha() > 0, "data.alpha", "must be positive");
  check(c.data().shards_per_client() > 0, "data.shards_per_client", "must be positive");
  const bool shakespeare = c.data().dataset() == "shakespeare";
  const bool wikitext =
      c.data().dataset() == "wikitext-2-test" || c.data().dataset() == "wikitext-2-valid";
  const bool text_data = shakespeare || wikitext;
  check(c.data().dataset() == "mnist" || c.data().dataset() == "fashion-mnist" || text_data,
        "data.dataset",
        "must be mnist, fashion-mnist, shakespeare, wikitext-2-test or "
        "wikitext-2-valid");
  const bool roles = c.data().partition() == v1::FedDataConfig::ROLES;
  const bool articles = c.data().partition() == v1::FedDataConfig::ARTICLES;
  const bool external = c.model().arch() == v1::FedModelConfig::EXTERNAL;
  const bool exec = c.client().trainer() == v1::FedClientConfig::EXEC;
  const bool text_model =
      c.model().arch() == v1::FedModelConfig::GPT || c.model().arch() == v1::FedModelConfig::MDLM;
  if (!external) {  // the user's own model brings its own data (data.path, or its trainer's)
    check(roles == shakespeare, "data.partition",
          "must be ROLES exactly when data.dataset is shakespeare");
    check(articles == wikitext, "data.partition",
          "must be ARTICLES exactly when data.dataset is wikitext-2-test or wikitext-2-valid");
    check(text_model == text_data, "model.arch",
          "must be GPT or MDLM exactly when data.dataset is text (shakespeare, wikitext-2-*)");
    check(!wikitext || c.model().arch() == v1::FedModelConfig::GPT, "model.arch",
          "must be GPT on WikiText-2 (MDLM federates Tiny Shakespeare's roles)");
  }
  if (external) {
    check(!c.model().weights().empty(), "model.weights",
          "must name the initial weights (safetensors) when model.arch is EXTERNAL");
  }
  check(c.data().tokenizer() == v1::DataConfig::CHAR ||
            (c.model().arch() == v1::FedModelConfig::GPT && text_data),
        "data.tokenizer",
        "GPT2 applies to model.arch GPT on text data (shakespeare, wikitext-2-*)");
  check(c.model().eval_command().empty() || external, "model.eval_command",
        "applies to model.arch EXTERNAL only");
  check(c.model().weights().empty() || external, "model.weights",
        "applies to model.arch EXTERNAL only");
  // Where the built-in trainer runs (edge_client/fused_gpt_trainer.h); whether the GPU is really
  // there is checked where a trainer is made (a client, a simulation), not on the aggregator.
  const bool cuda = c.client().device() == "cuda";
  check(cuda || c.client().device() == "cpu", "client.device", "must be \"cpu\" or \"cuda\"");
  if (cuda) {
    const bool fused =
        c.model().arch() == v1::FedModelConfig::GPT || c.model().arch() == v1::FedModelConfig::MDLM;
    const bool image = c.model().arch() == v1::FedModelConfig::DDPM ||
                       c.model().arch() == v1::FedModelConfig::CNN ||
                       c.model().arch() == v1::FedModelConfig::MLP;
    check(fused || image, "client.device",
          "\"cuda\" trains model.arch GPT and MDLM (the fused engine) and DDPM, CNN and MLP "
          "(the ops' CUDA forms); the other kinds train on the CPU");
    check(!fused || c.model().local_optimizer() == v1::FedModelConfig::ADAMW,
          "model.local_optimizer",
          "must be \"ADAMW\" with client.device \"cuda\" (the fused engine's optimizer)");
    check(!fused || c.local().prox_mu() == 0, "local.prox_mu",
          "must be 0 with client.device \"cuda\" (FedProx's term is the SGD trainer's)");
    check(!exec, "client.device", "\"cuda\" applies to the built-in trainer, not \"exec\"");
  }
  check(c.client().gpus().empty() || cuda, "client.gpus", "applies to client.device \"cuda\"");
  {
    std::vector<uint32_t> g(c.client().gpus().begin(), c.client().gpus().end());
    std::sort(g.begin(), g.end());
    check(std::adjacent_find(g.begin(), g.end()) == g.end(), "client.gpus",
          "names a GPU twice (one data-parallel rank per GPU)");
  }
  if (exec) {
    check(!c.client().trainer_command().empty() && !c.client().trainer_command(0).empty(),
          "client.trainer_command",
          "must name the trainer program when client.trainer is \"exec\" (e.g. [\"python3\", "
          "\"train.py\"])");
    check(c.client().trainer_timeout_s() > 0, "client.trainer_timeout_s", "must be positive");
  }
  check(exec || c.client().trainer_command().empty(), "client.trainer_command",
        "applies to client.trainer = \"exec\" only");
  check(c.data().test_fraction() > 0 && c.data().test_fraction() < 0.5, "data.test_fraction",
        "must be in (0, 0.5)");
  if (c.model().arch() == v1::FedModelConfig::CNN) {
    check(c.model().cnn_channels1() > 0 && c.model().cnn_channels2() > 0 && c.model().cnn_fc() > 0,
          "model.cnn_channels1", "cnn_channels1, cnn_channels2 and cnn_fc must be positive");
  }
  if (text_model) {
    check(c.model().n_layer() > 0 && c.model().n_head() > 0 && c.model().block_size() > 1,
          "model.n_layer", "n_layer, n_head must be positive and block_size above 1");
    check(c.model().n_head() > 0 && c.model().n_embd() > 0 &&
              c.model().n_embd() % c.model().n_head() == 0,
          "model.n_embd", "must be a positive multiple of model.n_head");
    if (c.model().pos_encoding() == v1::ModelConfig::ROPE) {
      check(c.model().n_head() == 0 || (c.model().n_embd() / c.model().n_head()) % 2 == 0,
            "model.pos_encoding", "\"rope\" needs an even head size (model.n_embd / model.n_head)");
      check(std::isfinite(c.model().rope_base()) && c.model().rope_base() > 1, "model.rope_base",
            "must be finite and > 1");
    }
    check(c.data().min_role_chars() > c.model().block_size(), "data.min_role_chars",
          "must exceed model.block_size (each client needs one training window)");
  }
  validate_diffusion_model(c, check);
  check(c.model().hidden() > 0, "model.hidden", "must be positive");
  check(std::isfinite(c.model().init_std()) && c.model().init_std() > 0, "model.init_std",
        "must be finite and positive");
  check(std::isfinite(c.model().init_bias()), "model.init_bias", "must be finite");
  check(c.client().partition_index() < c.data().num_clients(), "client.partition_index",
        "must be below data.num_clients");
  check(c.eval().target_accuracy() >= 0 && c.eval().target_accuracy() <= 1, "eval.target_accuracy",
        "must be in [0, 1]");
  check(c.robust().trim_fraction() >= 0 && c.robust().trim_fraction() < 0.5, "robust.trim_fraction",
        "must be in [0, 0.5)");
  check(c.robust().clip_norm() >= 0, "robust.clip_norm", "must be >= 0");
  const bool krum = c.robust().rule() == v1::FedRobustConfig::KRUM ||
                    c.robust().rule() == v1::FedRobustConfig::MULTI_KRUM;
  if (krum) {
    const uint32_t need = 2 * c.robust().byzantine_f() + 3;
    check(c.rounds().min_updates() >= need, "rounds.min_updates",
          ("must be at least 2 * robust.byzantine_f + 3 = " + std::to_string(need) +
           " for KRUM / MULTI_KRUM")
              .c_str());
    check(c.rounds().min_available() >= need, "rounds.min_available",
          ("must be at least 2 * robust.byzantine_f + 3 = " + std::to_string(need) +
           " for KRUM / MULTI_KRUM")
              .c_str());
    check(c.rounds().clients_per_round() >= need, "rounds.clients_per_round",
          ("must be at least 2 * robust.byzantine_f + 3 = " + std::to_string(need) +
           " for KRUM / MULTI_KRUM")
              .c_str());
  }
  check(c.robust().krum_m() == 0 || c.robust().rule() == v1::FedRobustConfig::MULTI_KRUM,
        "robust.krum_m", "applies to MULTI_KRUM only");
  check(c.dp().clip_norm() >= 0 && std::isfinite(c.dp().clip_norm()), "dp.clip_norm",
        "must be >= 0");
  if (c.dp().clip_norm() > 0) {
    check(c.dp().noise_multiplier() >= 0 && std::isfinite(c.dp().noise_multiplier()),
          "dp.noise_multiplier", "must be >= 0");
    check(c.dp().delta() > 0 && c.dp().delta() < 1, "dp.delta", "must be in (0, 1)");
    check(c.robust().rule() == v1::FedRobustConfig::MEAN, "dp.clip_norm",
          "needs robust.rule MEAN (DP-FedAvg averages every clipped update)");
    check(c.robust().clip_norm() == 0, "robust.clip_norm",
          "must be 0 when dp.clip_norm clips the updates");
    check(c.rounds().buffer_size() == 0, "dp.clip_norm",
          "needs synchronous rounds (rounds.buffer_size 0)");
  }
  if (c.secagg().enabled()) {
    const auto& sa = c.secagg();
    if (auto ratio = secagg_randk_ratio(c); !ratio.ok()) {
      errors += "\n  " + std::string(source) + ": " + ratio.status().message();
    } else if (*ratio > 0 && sa.noise_multiplier() > 0) {
      check(false, "local.codec",
            "must be \"identity\" with secagg.noise_multiplier: random-k's unbiased scaling "
            "would multiply the sensitivity the noise covers");
    }
    check(c.robust().rule() == v1::FedRobustConfig::MEAN && c.robust().clip_norm() == 0,
          "robust.rule",
          "must be MEAN without robust.clip_norm with [secagg]: the aggregator "
          "sees only the sum, not the updates it would rank or clip");
    check(c.dp().clip_norm() == 0, "dp.clip_norm",
          "must be 0 with [secagg] (central DP needs the updates in the clear)");
    check(c.rounds().buffer_size() == 0, "secagg.enabled",
          "needs synchronous rounds (rounds.buffer_size 0)");
    check(sa.dropout_tolerance() >= 0 && sa.dropout_tolerance() < 0.5, "secagg.dropout_tolerance",
          "must be in [0, 0.5)");
    check(sa.modulus_bits() >= 2 && sa.modulus_bits() <= 32, "secagg.modulus_bits",
          "must be in [2, 32]");
    check(sa.clip_range() > 0 && std::isfinite(sa.clip_range()), "secagg.clip_range",
          "must be positive");
    check(sa.quantization_levels() >= 2, "secagg.quantization_levels", "must be >= 2");
    check(sa.stage_timeout_ms() > 0, "secagg.stage_timeout_ms", "must be positive");
    check(sa.noise_multiplier() >= 0 && std::isfinite(sa.noise_multiplier()),
          "secagg.noise_multiplier", "must be >= 0 (0: no distributed DP)");
    if (sa.noise_multiplier() > 0) {
      check(sa.dp_clip_norm() > 0 && std::isfinite(sa.dp_clip_norm()), "secagg.dp_clip_norm",
            "must be positive");
      check(sa.dp_delta() > 0 && sa.dp_delta() < 1, "secagg.dp_delta", "must be in (0, 1)");
      check(!sa.error_feedback(), "secagg.error_feedback",
            "must be false with secagg.noise_multiplier: a residual would carry clipped mass "
            "past the clip, and the noise would no longer cover one client's influence");
    }
    if (sa.modulus_bits() >= 2 && sa.modulus_bits() <= 32 && sa.clip_range() > 0 &&
        sa.quantization_levels() >= 2) {
      const secagg::Quantizer q{sa.clip_range(), sa.quantization_levels(), sa.modulus_bits()};
      if (Status st = q.validate(c.data().num_clients()); !st.ok()) {
        check(false, "secagg.modulus_bits",
              (st.message() + " (data.num_clients clients could be summed)").c_str());
      }
    }
  }
  if (c.has_upstream()) {
    // A leaf's round is one round of the tier above: it averages, the root steps
    // (docs/federation.md, "Aggregator tiers").
    const auto& u = c.upstream();
    check(u.port() > 0 && u.port() <= 65535, "upstream.port", "must be a TCP port");
    check(!u.host().empty(), "upstream.host", "must name the aggregator above");
    check(u.deadline_fraction() > 0 && u.deadline_fraction() < 1, "upstream.deadline_fraction",
          "must be in (0, 1)");
    check(u.backoff_initial_ms() > 0 && u.backoff_max_ms() >= u.backoff_initial_ms(),
          "upstream.backoff_max_ms", "must be >= upstream.backoff_initial_ms > 0");
    check(u.chunk_kb() >= 1 && u.chunk_kb() <= 16 * 1024 - 1, "upstream.chunk_kb",
          "must be in [1, 16383] (a chunk and its framing must fit one 16 MiB frame)");
    check(c.rounds().buffer_size() == 0, "rounds.buffer_size",
          "must be 0 on a leaf ([upstream]): its rounds are the tier above's (FedBuff runs at "
          "the root, with leaves as its contributors)");
    check(c.strategy().kind() == v1::FedStrategyConfig::FEDAVG && c.strategy().server_lr() == 1,
          "strategy.kind",
          "must be FEDAVG with server_lr 1 on a leaf ([upstream]): a leaf averages and the root "
          "applies the strategy once; set [strategy] in the root's config");
    check(c.dp().clip_norm() == 0, "dp.clip_norm",
          "must be 0 on a leaf ([upstream]): central DP across tiers is not built (the "
          "accountant needs one Poisson sample over all clients and one noise draw)");
    check(!c.secagg().enabled(), "secagg.enabled",
          "must be false on a leaf ([upstream]): secure aggregation across tiers is not built "
          "(the leaf would upload its clients' sum in the clear)");
  }
  check(c.server().metrics_port() <= 65535, "server.metrics_port", "must be a TCP port (0: off)");
  check(c.server().download_window_kb() > 0, "server.download_window_kb", "must be positive");
  check(c.server().download_memory_mb() > 0, "server.download_memory_mb", "must be positive");
  check(c.server().upload_concurrency() > 0, "server.upload_concurrency", "must be positive");
  check(c.server().upload_stall_seconds() > 0, "server.upload_stall_seconds", "must be positive");
  if (!errors.empty()) return invalid_argument("invalid federation config:" + errors);
  return ok_status();
}

Result<double> secagg_randk_ratio(const v1::FederationConfig& config) {
  const std::string& codec = config.local().codec();
  if (codec == "identity") return 0.0;
  auto spec = compress::parse_codec_spec(codec);
  if (spec.ok() && spec->kind == compress::CodecKind::kRandk &&
      spec->values == compress::ValueCoding::kF32 && codec.find(';') == std::string::npos) {
    return spec->ratio;
  }
  return invalid_argument(
      "key 'local.codec' must be \"identity\" or \"randk:ratio=R\" with [secagg]: the masked "
      "vectors must line up coordinate by coordinate (top-k chooses per-client coordinates, int8 "
      "and qsgd per-client scales, and PowerSGD's factors P Q^T do not add up unless every "
      "client shares Q, which takes two secure sums a round; random-k composes, its coordinates "
      "drawn once per round for every client); secagg quantizes the values itself, "
      "secagg.modulus_bits bits each");
}

StrategyOptions strategy_options(const v1::FederationConfig& c) {
  StrategyOptions s;
  switch (c.strategy().kind()) {
    case v1::FedStrategyConfig::FEDAVG:
      s.kind = StrategyKind::kFedAvg;
      break;
    case v1::FedStrategyConfig::FEDAVGM:
      s.kind = StrategyKind::kFedAvgM;
      break;
    case v1::FedStrategyConfig::FEDADAM:
      s.kind = StrategyKind::kFedAdam;
      break;
    case v1::FedStrategyConfig::FEDYOGI:
      s.kind = StrategyKind::kFedYogi;
      break;
    case v1::FedStrategyConfig::FEDADAGRAD:
      s.kind = StrategyKind::kFedAdagrad;
      break;
  }
  s.server_lr = c.strategy().server_lr();
  s.momentum = c.strategy().momentum();
  s.beta1 = c.strategy().beta1();
  s.beta2 = c.strategy().beta2();
  s.tau = c.strategy().tau();
  return s;
}

AggregatorOptions aggregator_options(const v1::FederationConfig& c) {
  AggregatorOptions o;
  o.server.host = c.server().host();
  o.server.port = static_cast<uint16_t>(c.server().port());
  o.node_id = c.server().node_id();
  o.num_rounds = c.rounds().num_rounds();
  o.leaf = c.has_upstream();
  o.clients_per_round = c.rounds().clients_per_round();
  o.fraction = c.rounds().fraction();
  o.min_available = c.rounds().min_available();
  o.over_selection = c.rounds().over_selection();
  o.min_updates = c.rounds().min_updates();
  o.round_deadline = std::chrono::milliseconds(c.rounds().round_deadline_ms());
  o.seed = c.rounds().seed();
  o.buffer_size = c.rounds().buffer_size();
  o.max_staleness = c.rounds().max_staleness();
  o.strategy = strategy_options(c);
  o.local_steps = c.local().local_steps();
  o.batch_size = c.local().batch_size();
  o.learning_rate = c.local().learning_rate();
  o.codec = c.local().codec();
  o.state_dir = c.server().state_dir();
  o.upload_memory_bytes = static_cast<uint64_t>(c.server().upload_memory_mb()) << 20;
  o.spill_dir = c.server().spill_dir();
  o.download_window_bytes = static_cast<size_t>(c.server().download_window_kb()) << 10;
  o.download_memory_bytes = static_cast<uint64_t>(c.server().download_memory_mb()) << 20;
  o.upload_concurrency = c.server().upload_concurrency();
  o.upload_stall_timeout = std::chrono::seconds(c.server().upload_stall_seconds());
  switch (c.robust().rule()) {
    case v1::FedRobustConfig::MEAN:
      o.rule.rule = RobustRule::kMean;
      break;
    case v1::FedRobustConfig::MEDIAN:
      o.rule.rule = RobustRule::kMedian;
      break;
    case v1::FedRobustConfig::TRIMMED_MEAN:
      o.rule.rule = RobustRule::kTrimmedMean;
      break;
    case v1::FedRobustConfig::KRUM:
      o.rule.rule = RobustRule::kKrum;
      break;
    case v1::FedRobustConfig::MULTI_KRUM:
      o.rule.rule = RobustRule::kMultiKrum;
      break;
  }
  o.rule.byzantine_f = static_cast<int>(c.robust().byzantine_f());
  o.rule.krum_m = static_cast<int>(c.robust().krum_m());
  o.dp.clip_norm = c.dp().clip_norm();
  o.dp.noise_multiplier = c.dp().noise_multiplier();
  o.dp.delta = c.dp().delta();
  o.dp.simulation_seed = c.dp().simulation_seed();
  o.rule.trim_fraction = c.robust().trim_fraction();
  o.rule.clip_norm = c.robust().clip_norm();
  o.rule.fold_threads =
      c.server().fold_threads() > 0
          ? static_cast<int>(c.server().fold_threads())
          : static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  if (c.secagg().enabled()) {
    o.secagg = c.secagg();
    const auto ratio = secagg_randk_ratio(c);  // validated with the config
    o.secagg_randk_ratio = ratio.ok() ? *ratio : 0.0;
    o.secagg_stage_timeout = std::chrono::milliseconds(c.secagg().stage_timeout_ms());
  }
  return o;
}

edge_client::MnistTrainerOptions trainer_options(const v1::FederationConfig& c) {
  edge_client::MnistTrainerOptions o;
  o.hidden = c.model().hidden();
  o.init = edge_client::init_spec(c.model());
  if (c.model().arch() == v1::FedModelConfig::CNN) {
    o.model = edge_client::MnistModel::kCnn;
    o.cnn.channels1 = c.model().cnn_channels1();
    o.cnn.channels2 = c.model().cnn_channels2();
    o.cnn.hidden = c.model().cnn_fc();
  }
  o.epochs = c.local().epochs();
  o.prox_mu = c.local().prox_mu();
  return o;
}

Result<std::shared_ptr<const data::MnistSet>> load_split(const v1::FederationConfig& c,
                                                         bool train) {
  ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(c.data().data_dir()));
  ASSIGN_OR_RETURN(auto set, data::load_mnist_split(dir, c.data().dataset(), train));
  return std::shared_ptr<const data::MnistSet>(std::make_shared<data::MnistSet>(std::move(set)));
}

Result<data::Partition> make_partition(const v1::FederationConfig& c, const data::MnistSet& train) {
  const int clients = static_cast<int>(c.data().num_clients());
  switch (c.data().partition()) {
    case v1::FedDataConfig::IID:
      return data::partition_iid(train.size(), clients, c.data().seed());
    case v1::FedDataConfig::DIRICHLET:
      return data::partition_dirichlet(train.labels, clients, c.data().alpha(), c.data().seed());
    case v1::FedDataConfig::SHARDS:
      return data::partition_shards(
          train.labels, clients, static_cast<int>(c.data().shards_per_client()), c.data().seed());
    case v1::FedDataConfig::ROLES:
      return invalid_argument("data.partition ROLES splits Shakespeare text, not images");
    case v1::FedDataConfig::ARTICLES:
      return invalid_argument("data.partition ARTICLES splits WikiText, not images");
  }
  return invalid_argument("unknown partition");
}

std::unique_ptr<models::Classifier> make_model(const v1::FederationConfig& c, int64_t pixels) {
  return edge_client::make_mnist_model(trainer_options(c), pixels, c.model().seed());
}

Result<std::unique_ptr<MetricsLog>> MetricsLog::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return internal_error("cannot open metrics log " + path.string());
  return std::unique_ptr<MetricsLog>(new MetricsLog(f));
}

MetricsLog::~MetricsLog() { std::fclose(file_); }

void MetricsLog::write(const std::string& json_line) {
  std::fputs(json_line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

}  // namespace starling::aggregator
