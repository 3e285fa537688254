// The language models of federations (model.arch GPT and MDLM) on naturally split text: Tiny
// Shakespeare by speaking role, WikiText-2 by article (GPT). The GPT task here, the MDLM's in
// sim/diffusion_task.cc over the same role split.
#include "sim/gpt_task.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>

#include "aggregator/fed_task.h"
#include "core/autograd/autograd.h"
#include "core/data/bpe_tokenizer.h"
#include "core/data/char_tokenizer.h"
#include "core/data/data_dir.h"
#include "core/data/local_data.h"
#include "core/data/shakespeare_roles.h"
#include "core/data/text_file.h"
#include "core/data/wikitext_articles.h"
#include "edge_client/fused_gpt_trainer.h"
#include "edge_client/gpt_trainer.h"
#include "edge_client/model_params.h"
#include "models/gpt/checkpoint.h"
#include "models/gpt/hf.h"
#include "models/gpt/lora.h"
#include "sim/diffusion_task.h"
#include "sim/task_device.h"

namespace starling::sim {
namespace {

// The token ids of a client's own text for a language model of `tok`.
Result<std::shared_ptr<const std::vector<int32_t>>> local_tokens(const std::filesystem::path& path,
                                                                 const data::Tokenizer& tok,
                                                                 int64_t block_size,
                                                                 std::string* describe) {
  ASSIGN_OR_RETURN(auto ids, data::read_local_tokens(path, tok, block_size + 1));
  *describe = fmt::format("local data {} ({} tokens, never uploaded)", path.string(), ids.size());
  return std::make_shared<const std::vector<int32_t>>(std::move(ids));
}

// Which text a task's clients split, for its description and its checkpoints.
struct TextCorpus {
  std::string describe;  // "Tiny Shakespeare by speaking role"
  std::string dataset;   // the checkpoint's data.dataset, for `starling eval` / `sample`
  std::string prompt;    // the checkpoint's sample prompt
  std::string minor;     // "minor roles"
};

class ShakespeareTask final : public SimTask {
 public:
  // `base`: the pretrained model of model.init_from (null: random init from model.seed);
  // `lora`: [lora] checked.
  ShakespeareTask(const v1::FederationConfig& c, std::shared_ptr<const data::Tokenizer> tok,
                  std::shared_ptr<const std::vector<int32_t>> train, std::vector<int64_t> bounds,
                  std::vector<int32_t> test, std::vector<std::string> names, int64_t minor,
                  std::shared_ptr<const models::Gpt> base, models::LoraSpec lora, TextCorpus corpus,
                  TaskUse use)
      : config_(c),
        corpus_(std::move(corpus)),
        tokenizer_(std::move(tok)),
        train_(std::move(train)),
        bounds_(std::move(bounds)),
        test_(std::move(test)),
        names_(std::move(names)),
        minor_(minor),
        device_(c, use) {
    if (base) {
      options_.model = base->config();
      options_.model.dropout = 0.0;
      options_.context = c.model().block_size();
    } else {
      options_.model.vocab_size = tokenizer_->vocab_size();
      options_.model.block_size = c.model().block_size();
      options_.model.n_layer = c.model().n_layer();
      options_.model.n_head = c.model().n_head();
      options_.model.n_embd = c.model().n_embd();
      options_.model.rope = c.model().pos_encoding() == v1::ModelConfig::ROPE;
      options_.model.rope_base = c.model().rope_base();
      options_.model.gelu_tanh = c.model().activation() == v1::ModelConfig::GELU_TANH;
    }
    options_.base = std::move(base);
    options_.lora = std::move(lora);
    options_.epochs = c.local().epochs();
    options_.prox_mu = c.local().prox_mu();
    options_.grad_clip = c.model().grad_clip();
    const auto steps = edge_client::local_step_options(c);
    options_.optimizer = steps.optimizer;
    options_.beta1 = steps.beta1;
    options_.beta2 = steps.beta2;
    options_.weight_decay = steps.weight_decay;
    model_ = new_model(c.model().seed());
    layout_ = edge_client::layout_of(*model_);
  }

  int num_clients() const override { return static_cast<int>(names_.size()); }
  double client_examples(int client) const override {
    const auto k = static_cast<size_t>(client);
    return static_cast<double>(bounds_[k + 1] - bounds_[k]);
  }
  const compress::Layout& layout() const override { return layout_; }
  // The model every node builds: drawn from `seed`, or the base's weights (frozen, shared) with
  // the adapters of [lora].
  std::unique_ptr<models::Gpt> new_model(uint64_t seed) const {
    auto m = models::make_gpt(options_.model, seed, options_.base.get(), options_.lora);
    // The base was loaded for exactly this config: a mismatch is a bug, not bad input.
    if (!m.ok()) std::abort();
    return std::move(*m);
  }
  // Random init from model.seed; the pretrained weights of model.init_from; or, with [lora],
  // the adapters alone (A drawn from lora.seed, B zero: the global model starts as the base).
  std::vector<float> initial_model() const override {
    return edge_client::flatten(*new_model(config_.model().seed()));
  }
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    const auto k = static_cast<size_t>(client);
    return trainer_on(train_, bounds_[k], bounds_[k + 1], client);
  }
  std::unique_ptr<edge_client::LocalTrainer> make_central_trainer() const override {
    return trainer_on(train_, bounds_.front(), bounds_.back(), 0);
  }
  // The autograd GptTrainer on the CPU, the fused engine on [client] device "cuda".
  std::unique_ptr<edge_client::LocalTrainer> trainer_on(
      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
      int client) const {
    return device_.text_trainer<edge_client::GptTrainer, edge_client::FusedGptTrainer>(
        std::move(tokens), begin, end, options_, client, layout_);
  }
  Status check_device(std::string_view source) const {
    return device_.check_text<edge_client::FusedGptTrainer>(source, train_, bounds_.front(),
                                                            bounds_.back(), options_);
  }
  Result<std::unique_ptr<edge_client::LocalTrainer>> make_local_trainer(
      const std::filesystem::path& path, std::string* describe) const override {
    ASSIGN_OR_RETURN(auto ids, local_tokens(path, *tokenizer_, options_.window(), describe));
    const auto n = static_cast<int64_t>(ids->size());
    return trainer_on(std::move(ids), 0, n, 0);
  }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    const auto k = static_cast<size_t>(client);
    return edge_client::gpt_local_steps(bounds_[k + 1] - bounds_[k], options_.window(),
                                        options_.epochs, plan);
  }
  // Cross-entropy and next-character accuracy over disjoint windows of the held-out text,
  // evenly spaced (eval.max_examples of them; 0: all).
  TaskEval evaluate(std::span<const float> global) override {
    (void)edge_client::load_flat(*model_, global);
    return evaluate_model(*model_);
  }
  // evaluate() of the weights `model` holds.
  TaskEval evaluate_model(models::Gpt& model) const {
    autograd::NoGradGuard ng;
    model.train(false);
    const int64_t T = options_.window(), V = options_.model.vocab_size;
    const int64_t windows = (static_cast<int64_t>(test_.size()) - 1) / T;
    int64_t n = windows;
    if (config_.eval().max_examples() > 0) n = std::min<int64_t>(n, config_.eval().max_examples());
    double loss = 0, correct = 0;
    const int64_t kBatch = 32;
    std::vector<int32_t> x, y;
    for (int64_t w0 = 0; w0 < n; w0 += kBatch) {
      const int64_t B = std::min(kBatch, n - w0);
      x.resize(static_cast<size_t>(B * T));
      y.resize(x.size());
      for (int64_t b = 0; b < B; ++b) {
        const int64_t start = ((w0 + b) * windows / n) * T;
        for (int64_t t = 0; t < T; ++t) {
          x[static_cast<size_t>(b * T + t)] = test_[static_cast<size_t>(start + t)];
          y[static_cast<size_t>(b * T + t)] = test_[static_cast<size_t>(start + t + 1)];
        }
      }
      const Tensor logits = model.forward(Tensor::from_vector(x, {B, T})).contiguous();
      const float* l = logits.data<float>();
      for (int64_t r = 0; r < B * T; ++r) {
        const float* row = l + r * V;
        int64_t arg = 0;
        for (int64_t v = 1; v < V; ++v) arg = row[v] > row[arg] ? v : arg;
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - row[arg]));
        const auto target = static_cast<int64_t>(y[static_cast<size_t>(r)]);
        loss += std::log(sum) - static_cast<double>(row[target] - row[arg]);
        correct += arg == target ? 1.0 : 0.0;
      }
    }
    model.train(true);
    const double count = static_cast<double>(std::max<int64_t>(1, n * T));
    return {loss / count, correct / count};
  }
  Status save_model(const std::filesystem::path& path, std::span<const float> global,
                    uint64_t round) const override {
    const auto owned = new_model(0);
    models::Gpt& model = *owned;
    RETURN_IF_ERROR(edge_client::load_flat(model, global));
    v1::RunConfig rc;
    // The whole shape (a pretrained base brings biases and GPT-2's GELU); with [lora] the
    // checkpoint holds the merged weights, a plain GPT of this shape.
    *rc.mutable_model() = models::model_proto(options_.model);
    rc.mutable_train()->set_batch_size(
        std::max<int32_t>(1, static_cast<int32_t>(config_.local().batch_size())));
    rc.mutable_data()->set_dataset(corpus_.dataset);
    rc.mutable_data()->set_tokenizer(config_.data().tokenizer());
    rc.mutable_data()->set_data_dir(config_.data().data_dir());
    rc.mutable_sample()->set_prompt(corpus_.prompt);
    // The checkpoint's val loss is the held-out loss of these weights (what `starling sample`
    // reports); a federation has no one train loss, so the round's mean is not repeated here.
    const TaskEval eval = evaluate_model(model);
    return models::save_gpt_checkpoint(path, model, rc, *tokenizer_,
                                       {static_cast<int64_t>(round), 0.0, eval.loss});
  }
  std::string describe() const override {
    return fmt::format(
        "{}: {} clients ({} train tokens; {} {} {}), "
        "{} GPT L={} H={} C={} T={}, {} parameters{}{}",
        corpus_.describe, names_.size(), train_->size(), minor_, corpus_.minor,
        config_.data().merge_minor_roles() ? "merged" : "dropped", tokenizer_->name(),
        options_.model.n_layer, options_.model.n_head, options_.model.n_embd, options_.window(),
        model_->num_parameters(),
        options_.base ? fmt::format(" from {}", config_.model().init_from()) : "",
        options_.lora.enabled()
            ? fmt::format(", LoRA rank {} on {}: {} trained and moved ({:.2f}%)",
                          options_.lora.rank, fmt::join(options_.lora.targets, ", "),
                          model_->num_trainable_parameters(),
                          100.0 * static_cast<double>(model_->num_trainable_parameters()) /
                              static_cast<double>(model_->num_parameters()))
            : "",
        device_.describe());
  }

 private:
  v1::FederationConfig config_;
  TextCorpus corpus_;
  std::shared_ptr<const data::Tokenizer> tokenizer_;
  std::shared_ptr<const std::vector<int32_t>> train_;
  std::vector<int64_t> bounds_;  // client k trains on train_[bounds_[k], bounds_[k + 1])
  std::vector<int32_t> test_;
  std::vector<std::string> names_;
  int64_t minor_;
  edge_client::GptTrainerOptions options_;
  TaskDevice device_;                   // [client] device and gpus
  std::unique_ptr<models::Gpt> model_;  // evaluation only
  compress::Layout layout_;
};

}  // namespace

Result<std::unique_ptr<SimTask>> make_text_task(const v1::FederationConfig& c,
                                                std::string_view source, TaskUse use) {
  // The split is small (about 1 MB of text): every use loads it whole.
  const std::string ctx = std::string(source) + ": data";
  const bool wiki = c.data().partition() == v1::FedDataConfig::ARTICLES;
  const std::string dataset = wiki ? c.data().dataset() : "tinyshakespeare";
  ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(c.data().data_dir()), ctx);
  ASSIGN_OR_RETURN(auto file, data::resolve_dataset_file(dir, dataset), ctx);
  ASSIGN_OR_RETURN(std::string text, data::read_text_file(file), ctx);
  data::ShakespeareRolesOptions o;
  o.min_chars = c.data().min_role_chars();
  o.merge_minor = c.data().merge_minor_roles();
  o.test_fraction = c.data().test_fraction();
  TextCorpus corpus;
  data::ShakespeareRoles roles;
  if (wiki) {
    ASSIGN_OR_RETURN(roles, data::split_by_article(text, o, file.string()), ctx);
    corpus = {fmt::format("{} by Wikipedia article", dataset), dataset, " = ", "short articles"};
  } else {
    ASSIGN_OR_RETURN(roles, data::split_by_role(text, o, file.string()), ctx);
    corpus = {"Tiny Shakespeare by speaking role", "tinyshakespeare", "ROMEO:\n", "minor roles"};
  }
  ASSIGN_OR_RETURN(auto chars, data::CharTokenizer::from_corpus(text), ctx);
  std::shared_ptr<const data::Tokenizer> tok;
  std::shared_ptr<const models::Gpt> base;
  ASSIGN_OR_RETURN(models::LoraSpec lora, models::lora_spec_from_proto(c.lora(), source));
  const auto& m = c.model();
  if (lora.enabled() && m.arch() != v1::FedModelConfig::GPT) {
    return invalid_argument(std::string(source) + ": [lora] applies to model.arch = \"GPT\"");
  }
  if (!m.init_from().empty()) {
    const std::string key = std::string(source) + ": model.init_from";
    if (m.arch() != v1::FedModelConfig::GPT) {
      return invalid_argument(key + " applies to model.arch = \"GPT\"");
    }
    ASSIGN_OR_RETURN(models::PretrainedGpt pre, models::load_pretrained_gpt(m.init_from(), dir),
                     key);
    models::ShapeKeys keys;
    if (m.has_n_layer()) keys.n_layer = m.n_layer();
    if (m.has_n_head()) keys.n_head = m.n_head();
    if (m.has_n_embd()) keys.n_embd = m.n_embd();
    keys.block_size = m.block_size();
    if (m.has_pos_encoding()) keys.rope = m.pos_encoding() == v1::ModelConfig::ROPE;
    RETURN_IF_ERROR(models::check_pretrained_shape(pre, keys, source));
    spdlog::info("model: {} from {}", pre.describe, m.init_from());
    tok = pre.tokenizer;
    base = std::move(pre.gpt);
  } else if (c.data().tokenizer() == v1::DataConfig::GPT2) {
    ASSIGN_OR_RETURN(auto bpe, data::BpeTokenizer::load_gpt2(dir), ctx + ".tokenizer");
    tok = std::make_shared<const data::BpeTokenizer>(std::move(bpe));
  } else {
    tok = std::make_shared<const data::CharTokenizer>(chars);
  }
  auto train = std::make_shared<std::vector<int32_t>>();
  std::vector<int64_t> bounds{0};
  std::vector<int32_t> test;
  std::vector<std::string> names;
  // A pretrained base's character vocabulary may lack a few of this text's characters (WikiText-2
  // test has '#' and '^', its valid split does not): those bytes are dropped and counted, as a
  // BPE base would have split them into byte tokens; the count is logged, never hidden.
  const auto* base_chars = base ? dynamic_cast<const data::CharTokenizer*>(tok.get()) : nullptr;
  int64_t dropped = 0;
  auto known = [&](const std::string& t) {
    return base_chars ? base_chars->keep_known(t, &dropped) : t;
  };
  for (const auto& r : roles.roles) {
    ASSIGN_OR_RETURN(auto ids, tok->encode(known(r.train)), ctx);
    train->insert(train->end(), ids.begin(), ids.end());
    bounds.push_back(static_cast<int64_t>(train->size()));
    ASSIGN_OR_RETURN(auto test_ids, tok->encode(known(r.test)), ctx);
    test.insert(test.end(), test_ids.begin(), test_ids.end());
    names.push_back(r.role);
  }
  if (dropped > 0) {
    spdlog::warn(
        "{}: {} bytes of {} are outside the pretrained model's {} characters and were "
        "dropped",
        ctx, dropped, file.string(), base_chars->vocab_size());
  }
  if (static_cast<int64_t>(test.size()) <= c.model().block_size()) {
    return invalid_argument(ctx + ": the held-out text is shorter than one window");
  }
  if (c.model().arch() == v1::FedModelConfig::MDLM) {
    return make_mdlm_task(c, source, std::move(chars), std::move(train), std::move(bounds),
                          std::move(test), std::move(names), roles.minor_roles, use);
  }
  auto task = std::make_unique<ShakespeareTask>(
      c, std::move(tok), std::move(train), std::move(bounds), std::move(test), std::move(names),
      roles.minor_roles, std::move(base), std::move(lora), std::move(corpus), use);
  if (use != TaskUse::kServer) RETURN_IF_ERROR(task->check_device(source));
  return std::unique_ptr<SimTask>(std::move(task));
}

Result<std::unique_ptr<edge_client::LocalTrainer>> make_text_client_trainer(
    const v1::FederationConfig& config, std::string_view source, uint32_t partition,
    std::string* describe) {
  v1::FederationConfig c = config;
  c.mutable_eval()->set_every_rounds(0);  // evaluation is the aggregator's
  const int gpus = c.client().device() == "cuda" ? c.client().gpus_size() : 0;
  if (gpus > 1 && c.local().batch_size() % static_cast<uint32_t>(gpus) != 0) {
    return invalid_argument(std::string(source) +
                            ": key 'local.batch_size' = " + std::to_string(c.local().batch_size()) +
                            " does not split over the " + std::to_string(gpus) +
                            " GPUs of key 'client.gpus' (each data-parallel rank takes "
                            "batch_size / GPUs rows)");
  }
  ASSIGN_OR_RETURN(auto task, make_text_task(c, source, TaskUse::kClient));
  if (!c.data().path().empty()) {
    std::string what;
    ASSIGN_OR_RETURN(auto trainer, task->make_local_trainer(c.data().path(), &what), source);
    *describe = what + "; " + task->describe();
    return trainer;
  }
  if (static_cast<int>(partition) >= task->num_clients()) {
    return invalid_argument(std::string(source) + ": partition " + std::to_string(partition) +
                            " >= the task's " + std::to_string(task->num_clients()) + " clients (" +
                            task->describe() + ")");
  }
  *describe = task->describe();
  return task->make_trainer(static_cast<int>(partition));
}

}  // namespace starling::sim
