// The EXTERNAL task: a model the federation knows only as named tensors.
#include "sim/external_task.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>

#include "aggregator/fed_task.h"
#include "core/io/safetensors.h"
#include "edge_client/exec_trainer.h"
#include "edge_client/fed_config.h"
#include "edge_client/model_params.h"
#include "sim/task_device.h"

namespace starling::sim {
namespace {

namespace fs = std::filesystem;

std::string joined(const google::protobuf::RepeatedPtrField<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

class ExternalTask final : public SimTask {
 public:
  ExternalTask(const v1::FederationConfig& c, compress::Layout layout, std::vector<float> initial,
               fs::path scratch)
      : config_(c),
        layout_(std::move(layout)),
        initial_(std::move(initial)),
        scratch_(std::move(scratch)) {}
  ~ExternalTask() override {
    std::error_code ec;
    fs::remove_all(scratch_, ec);
  }

  int num_clients() const override { return static_cast<int>(config_.data().num_clients()); }
  const compress::Layout& layout() const override { return layout_; }
  std::vector<float> initial_model() const override { return initial_; }
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    const std::string node = "client-" + std::to_string(client);
    auto options = edge_client::exec_trainer_options(config_, node, static_cast<uint32_t>(client),
                                                     scratch_ / node);
    if (!config_.client().trainer_dir().empty()) options.dir = options.dir / node;
    auto t = edge_client::ExecTrainer::create(layout_, std::move(options));
    if (!t.ok())  // A client whose exec trainer could not be made: every round is lost, with why.
      return std::make_unique<FailedTrainer>(layout_, t.status(), /*recoverable=*/true);
    return std::move(*t);
  }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    (void)client;
    return std::max<int64_t>(1, plan.local_steps());
  }
  TaskEval evaluate(std::span<const float> global) override {
    constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
    if (config_.model().eval_command().empty()) return {kNan, kNan};
    if (!evaluator_) {
      auto options = edge_client::exec_trainer_options(config_, "aggregator", 0, scratch_ / "eval");
      if (!config_.client().trainer_dir().empty()) options.dir = options.dir / "eval";
      options.command.assign(config_.model().eval_command().begin(),
                             config_.model().eval_command().end());
      auto e = edge_client::ExecTrainer::create(layout_, std::move(options));
      if (!e.ok()) {
        spdlog::error("model.eval_command: {}", e.status().to_string());
        return {kNan, kNan};
      }
      evaluator_ = std::move(*e);
    }
    auto m = evaluator_->evaluate(global, ++evaluations_);
    if (!m.ok()) {
      spdlog::error("model.eval_command: evaluation failed: {}", m.status().to_string());
      return {kNan, kNan};
    }
    return {m->loss, m->has_accuracy ? m->accuracy : kNan};
  }
  Status save_model(const fs::path& path, std::span<const float> global,
                    uint64_t round) const override {
    return io::save_safetensors(path, edge_client::layout_tensors(layout_, global),
                                {{"format", "starling-federation"},
                                 {"round", std::to_string(round)},
                                 {"model", "external"}});
  }
  std::string describe() const override {
    return "your own model (" + config_.model().weights() + ": " + std::to_string(layout_.size()) +
           " tensors, " + std::to_string(initial_.size()) + " parameters), trained by `" +
           joined(config_.client().trainer_command()) + "`";
  }

 private:
  v1::FederationConfig config_;
  compress::Layout layout_;
  std::vector<float> initial_;
  fs::path scratch_;
  std::unique_ptr<edge_client::ExecTrainer> evaluator_;
  uint64_t evaluations_ = 0;
};

Result<compress::Layout> external_layout(const v1::FederationConfig& c, std::string_view source,
                                         std::vector<float>* values) {
  const std::string ctx = std::string(source) + ": model.weights";
  ASSIGN_OR_RETURN(auto file, io::load_safetensors(c.model().weights()), ctx);
  ASSIGN_OR_RETURN(auto layout, edge_client::layout_of_file(file, c.model().weights(), values),
                   ctx);
  return layout;
}

}  // namespace

Result<std::unique_ptr<SimTask>> make_external_task(const v1::FederationConfig& c,
                                                    std::string_view source) {
  std::vector<float> initial;
  ASSIGN_OR_RETURN(auto layout, external_layout(c, source, &initial));
  static std::atomic<int> counter{0};
  const fs::path scratch =
      fs::temp_directory_path() /
      ("starling-exec-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  return std::unique_ptr<SimTask>(
      new ExternalTask(c, std::move(layout), std::move(initial), scratch));
}

Status check_simulated_trainer(const v1::FederationConfig& c, std::string_view source) {
  if (c.model().arch() == v1::FedModelConfig::EXTERNAL &&
      c.client().trainer() != v1::FedClientConfig::EXEC) {
    return invalid_argument(std::string(source) +
                            ": key 'client.trainer' must be \"exec\" when model.arch is EXTERNAL "
                            "(starling has no built-in trainer for your model)");
  }
  return ok_status();
}

Status check_external_evaluation(const v1::FederationConfig& c, std::string_view source) {
  if (c.model().arch() == v1::FedModelConfig::EXTERNAL && c.eval().every_rounds() > 0 &&
      c.model().eval_command().empty()) {
    return invalid_argument(std::string(source) +
                            ": key 'eval.every_rounds' must be 0 when model.arch is EXTERNAL "
                            "without model.eval_command (nothing built in can evaluate your "
                            "model)");
  }
  return ok_status();
}

Result<compress::Layout> federation_layout(const v1::FederationConfig& c, std::string_view source) {
  if (c.model().arch() == v1::FedModelConfig::EXTERNAL) return external_layout(c, source, nullptr);
  v1::FederationConfig shape_only = c;  // no test split to load: only the layout is needed
  shape_only.mutable_eval()->set_every_rounds(0);
  ASSIGN_OR_RETURN(auto task, SimTask::create(shape_only, source, TaskUse::kServer));
  return task->layout();
}

}  // namespace starling::sim
