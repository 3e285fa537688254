// The image classifiers (model.arch MLP and CNN) on MNIST-style data: the 2NN of McMahan et
// al. or their CNN, an image partition of [data], label accuracy on the test split.
#include "sim/mnist_task.h"

#include <fmt/format.h>

#include <algorithm>

#include "aggregator/fed_task.h"
#include "core/data/data_dir.h"
#include "core/data/local_data.h"
#include "core/io/safetensors.h"
#include "edge_client/mnist_trainer.h"
#include "edge_client/model_params.h"
#include "sim/task_device.h"

namespace starling::sim {
namespace {

class MnistTask final : public SimTask {
 public:
  MnistTask(const v1::FederationConfig& c, std::shared_ptr<const data::MnistSet> train,
            std::shared_ptr<const data::MnistSet> test, data::Partition parts, TaskUse use)
      : config_(c),
        device_(c, use),
        train_(std::move(train)),
        test_(std::move(test)),
        parts_(std::move(parts)) {
    model_ = aggregator::make_model(c, pixels());
    layout_ = edge_client::layout_of(*model_);
  }

  // kServer: data.num_clients (no partition is computed).
  double client_examples(int client) const override {
    return train_ ? static_cast<double>(parts_[static_cast<size_t>(client)].size()) : 1.0;
  }
  int num_clients() const override {
    return train_ ? static_cast<int>(parts_.size())
                  : static_cast<int>(config_.data().num_clients());
  }
  const compress::Layout& layout() const override { return layout_; }
  std::vector<float> initial_model() const override {
    return edge_client::flatten(*aggregator::make_model(config_, pixels()));
  }
  // [client] device "cuda": the classifier on the client's GPU (client k on gpus[k mod n]).
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    auto o = aggregator::trainer_options(config_);
    o.device = device_.image_device(client);
    return std::make_unique<edge_client::MnistTrainer>(train_, parts_[static_cast<size_t>(client)],
                                                       o);
  }
  Status check_device(std::string_view source) const { return device_.check_image(source); }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    if (plan.local_steps() > 0) return plan.local_steps();
    const auto n = static_cast<int64_t>(parts_[static_cast<size_t>(client)].size());
    const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(plan.batch_size(), n));
    return static_cast<int64_t>(config_.local().epochs()) * ((n + batch - 1) / batch);
  }
  TaskEval evaluate(std::span<const float> global) override {
    if (!test_) return {};
    (void)edge_client::load_flat(*model_, global);
    int64_t n = test_->size();
    if (config_.eval().max_examples() > 0) {
      n = std::min<int64_t>(n, config_.eval().max_examples());
    }
    const auto e = models::evaluate(*model_, test_->images.data(), test_->labels.data(), n);
    return {e.loss, e.accuracy};
  }
  Status save_model(const std::filesystem::path& path, std::span<const float> global,
                    uint64_t round) const override {
    return io::save_safetensors(
        path, edge_client::layout_tensors(layout_, global),
        {{"format", "starling-federation"},
         {"round", std::to_string(round)},
         {"model", config_.model().arch() == v1::FedModelConfig::CNN ? "cnn" : "mlp"},
         {"hidden", std::to_string(config_.model().hidden())}});
  }
  std::string describe() const override {
    const char* part[] = {"IID", "Dirichlet", "shards", "roles"};
    const std::string model = config_.model().arch() == v1::FedModelConfig::CNN
                                  ? std::string("CNN")
                                  : fmt::format("2NN {}-{}-{}-10", pixels(),
                                                config_.model().hidden(), config_.model().hidden());
    const std::string examples = train_
                                     ? fmt::format("{} train examples", train_->size())
                                     : fmt::format("{} test examples; training data on the clients",
                                                   test_ ? test_->size() : 0);
    const auto& m = config_.model();
    const std::string init =
        m.init() == v1::FedModelConfig::TRUNCATED_NORMAL
            ? fmt::format("truncated normal init (std {}, bias {})", m.init_std(), m.init_bias())
        : m.init() == v1::FedModelConfig::GLOROT ? "Glorot init"
                                                 : "PyTorch init";
    return fmt::format("{} ({}), {} partition over {} clients; {}, {} parameters, {}{}",
                       config_.data().dataset(), examples,
                       part[static_cast<int>(config_.data().partition())], num_clients(), model,
                       model_->num_parameters(), init, device_.describe_image());
  }

 private:
  int64_t pixels() const { return train_ ? train_->pixels() : test_ ? test_->pixels() : 28 * 28; }

  v1::FederationConfig config_;
  TaskDevice device_;  // [client] device and gpus
  std::shared_ptr<const data::MnistSet> train_;
  std::shared_ptr<const data::MnistSet> test_;
  data::Partition parts_;
  std::unique_ptr<models::Classifier> model_;  // evaluation only
  compress::Layout layout_;
};

}  // namespace

Result<ImageSplits> load_image_splits(const v1::FederationConfig& c, std::string_view source,
                                      TaskUse use) {
  const std::string ctx = std::string(source) + ": data";
  ImageSplits s;
  if (use != TaskUse::kServer) {
    ASSIGN_OR_RETURN(s.train, aggregator::load_split(c, true), ctx);
    ASSIGN_OR_RETURN(s.parts, aggregator::make_partition(c, *s.train), ctx);
  }
  if (c.eval().every_rounds() > 0) {
    ASSIGN_OR_RETURN(s.test, aggregator::load_split(c, false), ctx);
  }
  return s;
}

Result<std::unique_ptr<SimTask>> make_mnist_task(const v1::FederationConfig& c,
                                                 std::string_view source, TaskUse use) {
  ASSIGN_OR_RETURN(ImageSplits s, load_image_splits(c, source, use));
  auto task = std::make_unique<MnistTask>(c, std::move(s.train), std::move(s.test),
                                          std::move(s.parts), use);
  if (use != TaskUse::kServer) RETURN_IF_ERROR(task->check_device(source));
  return std::unique_ptr<SimTask>(std::move(task));
}

Result<std::unique_ptr<edge_client::LocalTrainer>> make_mnist_client_trainer(
    const v1::FederationConfig& c, std::string_view source, uint32_t partition,
    std::string* describe) {
  const std::string ctx = std::string(source) + ": data";
  data::MnistSet own;
  if (!c.data().path().empty()) {
    // The device's own labelled images ([data] path): all of them, never uploaded.
    ASSIGN_OR_RETURN(own, data::read_local_images(c.data().path(), 28, 28));
    *describe =
        fmt::format("local data {} ({} examples, never uploaded)", c.data().path(), own.size());
  } else {
    // Only this client's examples: the partition is computed from the labels, and only its
    // images are converted to floats (never the whole training set).
    ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(c.data().data_dir()), ctx);
    auto choose = [&](const data::MnistSet& labels) -> Result<std::vector<int64_t>> {
      ASSIGN_OR_RETURN(auto parts, aggregator::make_partition(c, labels));
      if (partition >= parts.size()) {
        return invalid_argument("partition " + std::to_string(partition) + " outside [0, " +
                                std::to_string(parts.size()) + ")");
      }
      if (parts[partition].empty()) {
        return failed_precondition("partition " + std::to_string(partition) + " has no examples");
      }
      return std::move(parts[partition]);
    };
    ASSIGN_OR_RETURN(own, data::load_mnist_split_subset(dir, c.data().dataset(), true, choose),
                     ctx);
    *describe = fmt::format("partition {} ({} examples of {}, only these loaded)", partition,
                            own.size(), c.data().dataset());
  }
  std::vector<int64_t> indices(static_cast<size_t>(own.size()));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
  auto o = aggregator::trainer_options(c);
  ASSIGN_OR_RETURN(o.device, image_client_device(c, source));
  return std::unique_ptr<edge_client::LocalTrainer>(std::make_unique<edge_client::MnistTrainer>(
      std::make_shared<const data::MnistSet>(std::move(own)), std::move(indices), o));
}

}  // namespace starling::sim
