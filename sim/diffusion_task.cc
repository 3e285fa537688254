// The MDLM and DDPM tasks of federations.
#include "sim/diffusion_task.h"

#include <fmt/format.h>

#include <algorithm>

#include "aggregator/fed_task.h"
#include "core/data/data_dir.h"
#include "core/data/local_data.h"
#include "edge_client/ddpm_trainer.h"
#include "edge_client/fused_mdlm_trainer.h"
#include "edge_client/gpt_trainer.h"
#include "edge_client/mdlm_trainer.h"
#include "edge_client/model_params.h"
#include "models/ddpm/checkpoint.h"
#include "models/ddpm/trainer.h"
#include "models/mdlm/checkpoint.h"
#include "models/mdlm/trainer.h"
#include "sim/mnist_task.h"
#include "sim/task_device.h"

namespace starling::sim {
namespace {

constexpr uint64_t kEvalSeed = 0x5eed;  // the centralized trainers' evaluation seed
constexpr int64_t kEvalBatch = 32;

class MdlmTask final : public SimTask {
 public:
  MdlmTask(const v1::FederationConfig& c, data::CharTokenizer tok,
           std::shared_ptr<const std::vector<int32_t>> train, std::vector<int64_t> bounds,
           std::vector<int32_t> test, std::vector<std::string> names, int64_t minor, TaskUse use)
      : config_(c),
        tokenizer_(std::move(tok)),
        train_(std::move(train)),
        bounds_(std::move(bounds)),
        test_(std::move(test)),
        names_(std::move(names)),
        minor_(minor),
        options_(edge_client::mdlm_trainer_options(c, tokenizer_.vocab_size())),
        model_(std::make_unique<models::Mdlm>(options_.model, c.model().seed())),
        layout_(edge_client::layout_of(*model_)),
        device_(c, use) {}

  int num_clients() const override { return static_cast<int>(names_.size()); }
  const compress::Layout& layout() const override { return layout_; }
  std::vector<float> initial_model() const override {
    return edge_client::flatten(models::Mdlm(options_.model, config_.model().seed()));
  }
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    const auto k = static_cast<size_t>(client);
    return trainer_on(train_, bounds_[k], bounds_[k + 1], client);
  }
  // The autograd MdlmTrainer on the CPU, the fused engine on [client] device "cuda".
  std::unique_ptr<edge_client::LocalTrainer> trainer_on(
      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
      int client) const {
    return device_.text_trainer<edge_client::MdlmTrainer, edge_client::FusedMdlmTrainer>(
        std::move(tokens), begin, end, options_, client, layout_);
  }
  Status check_device(std::string_view source) const {
    return device_.check_text<edge_client::FusedMdlmTrainer>(source, train_, bounds_.front(),
                                                             bounds_.back(), options_);
  }
  Result<std::unique_ptr<edge_client::LocalTrainer>> make_local_trainer(
      const std::filesystem::path& path, std::string* describe) const override {
    ASSIGN_OR_RETURN(auto ids,
                     data::read_local_tokens(path, tokenizer_, options_.model.block_size + 1));
    *describe =
        fmt::format("local data {} ({} characters, never uploaded)", path.string(), ids.size());
    const auto n = static_cast<int64_t>(ids.size());
    return trainer_on(std::make_shared<const std::vector<int32_t>>(std::move(ids)), 0, n, 0);
  }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    const auto k = static_cast<size_t>(client);
    return edge_client::gpt_local_steps(bounds_[k + 1] - bounds_[k], options_.model.block_size,
                                        options_.epochs, plan);
  }
  // loss: the deterministic NELBO (nats per character; / ln 2 for bits per character) of
  // mdlm_eval_nelbo over eval.max_examples windows (0: every disjoint window) of the held-out
  // text; accuracy: the fraction of corrupted characters the argmax prediction restores.
  TaskEval evaluate(std::span<const float> global) override {
    (void)edge_client::load_flat(*model_, global);
    const int64_t T = options_.model.block_size;
    int64_t n = std::max<int64_t>(1, static_cast<int64_t>(test_.size()) / T);
    if (config_.eval().max_examples() > 0) n = std::min<int64_t>(n, config_.eval().max_examples());
    TaskEval e;
    e.loss = models::mdlm_eval_nelbo(*model_, test_, n, kEvalBatch, kEvalSeed, &e.accuracy);
    return e;
  }
  Status save_model(const std::filesystem::path& path, std::span<const float> global,
                    uint64_t round) const override {
    models::Mdlm model(options_.model, 0);
    RETURN_IF_ERROR(edge_client::load_flat(model, global));
    return models::save_mdlm_checkpoint(
        path, model, edge_client::mdlm_run_config(config_, tokenizer_.vocab_size()), tokenizer_,
        {static_cast<int64_t>(round), 0.0, 0.0});
  }
  std::string describe() const override {
    return fmt::format(
        "Tiny Shakespeare by speaking role: {} clients ({} train characters; {} minor roles {}), "
        "MDLM ({} noise) L={} H={} C={} T={}, {} parameters{}",
        names_.size(), train_->size(), minor_,
        config_.data().merge_minor_roles() ? "merged" : "dropped",
        options_.model.noise == models::DiffusionNoise::kAbsorbing ? "absorbing" : "uniform",
        options_.model.n_layer, options_.model.n_head, options_.model.n_embd,
        options_.model.block_size, model_->num_parameters(), device_.describe());
  }

 private:
  v1::FederationConfig config_;
  data::CharTokenizer tokenizer_;
  std::shared_ptr<const std::vector<int32_t>> train_;
  std::vector<int64_t> bounds_;
  std::vector<int32_t> test_;
  std::vector<std::string> names_;
  int64_t minor_;
  edge_client::MdlmTrainerOptions options_;
  std::unique_ptr<models::Mdlm> model_;  // evaluation only
  compress::Layout layout_;
  TaskDevice device_;  // [client] device and gpus
};

class DdpmTask final : public SimTask {
 public:
  DdpmTask(const v1::FederationConfig& c, std::shared_ptr<const data::MnistSet> train,
           std::shared_ptr<const data::MnistSet> test, data::Partition parts, TaskUse use)
      : config_(c),
        device_(c, use),
        train_(std::move(train)),
        parts_(std::move(parts)),
        options_(edge_client::ddpm_trainer_options(c)),
        model_(std::make_unique<models::Ddpm>(options_.model, c.model().seed())),
        layout_(edge_client::layout_of(model_->net())) {
    if (test) {
      std::vector<int64_t> all(static_cast<size_t>(test->size()));
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
      test_x_ = edge_client::ddpm_images(*test, all);
    }
  }

  // kServer: data.num_clients (no partition is computed).
  int num_clients() const override {
    return train_ ? static_cast<int>(parts_.size())
                  : static_cast<int>(config_.data().num_clients());
  }
  const compress::Layout& layout() const override { return layout_; }
  std::vector<float> initial_model() const override {
    return edge_client::flatten(models::Ddpm(options_.model, config_.model().seed()).net());
  }
  // [client] device "cuda": the U-Net on the client's GPU (virtual client k on gpus[k mod n]).
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    edge_client::DdpmTrainerOptions o = options_;
    o.device = device_.image_device(client);
    return std::make_unique<edge_client::DdpmTrainer>(train_, parts_[static_cast<size_t>(client)],
                                                      o);
  }
  Status check_device(std::string_view source) const { return device_.check_image(source); }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    return edge_client::ddpm_local_steps(
        static_cast<int64_t>(parts_[static_cast<size_t>(client)].size()), options_.epochs, plan);
  }
  // loss: ddpm_eval_loss (epsilon MSE) over eval.max_examples test images evenly spaced (0: all),
  // with the centralized trainer's fixed steps and noise; accuracy: 1 - loss, the fraction of
  // the noise variance the network explains.
  TaskEval evaluate(std::span<const float> global) override {
    if (!test_x_.defined()) return {};
    (void)edge_client::load_flat(model_->net(), global);
    int64_t n = test_x_.size(0);
    if (config_.eval().max_examples() > 0) n = std::min<int64_t>(n, config_.eval().max_examples());
    const double loss = models::ddpm_eval_loss(*model_, test_x_, n, kEvalBatch, kEvalSeed);
    return {loss, 1.0 - loss};
  }
  Status save_model(const std::filesystem::path& path, std::span<const float> global,
                    uint64_t round) const override {
    models::Ddpm model(options_.model, 0);
    RETURN_IF_ERROR(edge_client::load_flat(model.net(), global));
    return models::save_ddpm_checkpoint(path, model, edge_client::ddpm_run_config(config_),
                                        {static_cast<int64_t>(round), 0.0, 0.0});
  }
  std::string describe() const override {
    const char* part[] = {"IID", "Dirichlet", "shards", "roles"};
    return fmt::format(
        "{} ({}), {} partition over {} clients; DDPM U-Net base {} mult [{}], T={}, "
        "{} parameters{}",
        config_.data().dataset(),
        train_ ? fmt::format("{} train images", train_->size())
               : std::string("training images on the clients"),
        part[static_cast<int>(config_.data().partition())], num_clients(),
        options_.model.unet.base_channels, fmt::join(options_.model.unet.channel_mult, ", "),
        options_.model.schedule.timesteps, model_->net().num_parameters(),
        device_.describe_image());
  }

 private:
  v1::FederationConfig config_;
  TaskDevice device_;  // [client] device and gpus
  std::shared_ptr<const data::MnistSet> train_;
  data::Partition parts_;
  edge_client::DdpmTrainerOptions options_;
  std::unique_ptr<models::Ddpm> model_;  // evaluation only
  compress::Layout layout_;
  Tensor test_x_;  // (N, 1, H, W) in [-1, 1]
};

}  // namespace

Result<std::unique_ptr<SimTask>> make_mdlm_task(
    const v1::FederationConfig& c, std::string_view source, data::CharTokenizer tok,
    std::shared_ptr<const std::vector<int32_t>> train, std::vector<int64_t> bounds,
    std::vector<int32_t> test, std::vector<std::string> names, int64_t minor, TaskUse use) {
  const Status st = edge_client::mdlm_trainer_options(c, tok.vocab_size()).model.validate();
  if (!st.ok()) return invalid_argument(std::string(source) + ": model: " + st.message());
  auto task = std::make_unique<MdlmTask>(c, std::move(tok), std::move(train), std::move(bounds),
                                         std::move(test), std::move(names), minor, use);
  if (use != TaskUse::kServer) RETURN_IF_ERROR(task->check_device(source));
  return std::unique_ptr<SimTask>(std::move(task));
}

Status check_ddpm_images(const v1::FederationConfig& c, std::string_view source,
                         const data::MnistSet& images) {
  const auto options = edge_client::ddpm_trainer_options(c);
  if (images.rows != options.model.unet.image_size ||
      images.cols != options.model.unet.image_size || options.model.unet.in_channels != 1) {
    return invalid_argument(fmt::format(
        "{}: keys 'model.ddpm.image_size' = {} and 'model.ddpm.image_channels' = {} do not match "
        "{} ({}x{}, 1 channel)",
        source, options.model.unet.image_size, options.model.unet.in_channels, c.data().dataset(),
        images.rows, images.cols));
  }
  return ok_status();
}

Result<std::unique_ptr<edge_client::LocalTrainer>> make_ddpm_client_trainer(
    const v1::FederationConfig& c, std::string_view source, int partition, int64_t* images) {
  RETURN_IF_ERROR(aggregator::validate_federation_config(c, source));
  const std::string ctx = std::string(source) + ": data";
  ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(c.data().data_dir()), ctx);
  auto choose = [&](const data::MnistSet& labels) -> Result<std::vector<int64_t>> {
    ASSIGN_OR_RETURN(auto parts, aggregator::make_partition(c, labels));
    if (partition < 0 || static_cast<size_t>(partition) >= parts.size()) {
      return invalid_argument("partition " + std::to_string(partition) + " outside [0, " +
                              std::to_string(parts.size()) + ")");
    }
    if (parts[static_cast<size_t>(partition)].empty()) {
      return failed_precondition("partition " + std::to_string(partition) + " has no images");
    }
    return std::move(parts[static_cast<size_t>(partition)]);
  };
  ASSIGN_OR_RETURN(data::MnistSet own,
                   data::load_mnist_split_subset(dir, c.data().dataset(), true, choose), ctx);
  RETURN_IF_ERROR(check_ddpm_images(c, source, own));
  std::vector<int64_t> indices(static_cast<size_t>(own.size()));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
  *images = own.size();
  edge_client::DdpmTrainerOptions o = edge_client::ddpm_trainer_options(c);
  ASSIGN_OR_RETURN(o.device, image_client_device(c, source));
  return std::unique_ptr<edge_client::LocalTrainer>(std::make_unique<edge_client::DdpmTrainer>(
      std::make_shared<const data::MnistSet>(std::move(own)), std::move(indices), o));
}

Result<std::unique_ptr<SimTask>> make_ddpm_task(const v1::FederationConfig& c,
                                                std::string_view source, TaskUse use) {
  ASSIGN_OR_RETURN(ImageSplits s, load_image_splits(c, source, use));
  if (s.train) RETURN_IF_ERROR(check_ddpm_images(c, source, *s.train));
  if (s.test) RETURN_IF_ERROR(check_ddpm_images(c, source, *s.test));
  auto task =
      std::make_unique<DdpmTask>(c, std::move(s.train), std::move(s.test), std::move(s.parts), use);
  if (use != TaskUse::kServer) RETURN_IF_ERROR(task->check_device(source));
  return std::unique_ptr<SimTask>(std::move(task));
}

}  // namespace starling::sim
