// SimTask behind gossip::ModelTask.
#include "sim/gossip_tasks.h"

#include <memory>

#include "gossip/task.h"
#include "sim/task.h"

namespace starling::sim {
namespace {

class SimModelTask final : public gossip::ModelTask {
 public:
  explicit SimModelTask(std::unique_ptr<SimTask> task) : task_(std::move(task)) {}
  const compress::Layout& layout() const override { return task_->layout(); }
  std::vector<float> initial() const override { return task_->initial_model(); }
  int num_partitions() const override { return task_->num_clients(); }
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int partition) const override {
    return task_->make_trainer(partition);
  }
  double examples(int partition) const override { return task_->client_examples(partition); }
  gossip::TaskEval evaluate(std::span<const float> params) override {
    const TaskEval e = task_->evaluate(params);
    gossip::TaskEval out;
    out.loss = e.loss;
    out.accuracy = e.accuracy;
    return out;
  }
  std::string describe() const override { return task_->describe(); }

 private:
  std::unique_ptr<SimTask> task_;
};

}  // namespace

v1::FederationConfig federation_of(const v1::GossipConfig& g) {
  v1::FederationConfig f;
  *f.mutable_data() = g.data();
  *f.mutable_model() = g.model();
  *f.mutable_lora() = g.lora();
  f.mutable_local()->set_local_steps(g.local().local_steps());
  f.mutable_local()->set_batch_size(g.local().batch_size());
  f.mutable_local()->set_learning_rate(g.local().learning_rate());
  f.mutable_local()->set_codec(g.algorithm().codec());
  f.mutable_eval()->set_max_examples(g.eval().max_examples());
  f.mutable_client()->set_device(g.peer().device());
  for (uint32_t gpu : g.peer().gpus()) f.mutable_client()->add_gpus(gpu);
  return f;
}

void register_gossip_model_tasks() {
  gossip::set_model_task_factory([](const v1::GossipConfig& g, std::string_view source,
                                    bool one_peer) -> Result<std::unique_ptr<gossip::ModelTask>> {
    auto task = SimTask::create(federation_of(g), source,
                                one_peer ? TaskUse::kClient : TaskUse::kSimulation);
    if (!task.ok()) {
      // The federation's keys of the trainer's device are [peer]'s here.
      std::string why = task.status().message();
      for (const auto& [from, to] :
           {std::pair<std::string, std::string>{"client.device", "peer.device"},
            {"client.gpus", "peer.gpus"}}) {
        for (size_t at = why.find(from); at != std::string::npos; at = why.find(from, at))
          why.replace(at, from.size(), to);
      }
      return Status(task.status().code(), why);
    }
    return std::unique_ptr<gossip::ModelTask>(std::make_unique<SimModelTask>(std::move(*task)));
  });
}

}  // namespace starling::sim
