// The registry of model kinds: one line per [model] arch. A new kind adds its file (its SimTask
// and its client trainer) and one line here; every role finds it through model_kind().
#include <fmt/format.h>

#include "sim/diffusion_task.h"
#include "sim/external_task.h"
#include "sim/gpt_task.h"
#include "sim/mnist_task.h"
#include "sim/model_kind.h"

namespace starling::sim {
namespace {

using Arch = v1::FedModelConfig;

Result<std::unique_ptr<edge_client::LocalTrainer>> ddpm_client_trainer(
    const v1::FederationConfig& c, std::string_view source, uint32_t partition,
    std::string* describe) {
  if (!c.data().path().empty()) {
    return invalid_argument(std::string(source) +
                            ": data.path is not read by DDPM clients yet; they train on their "
                            "partition of data.dataset");
  }
  int64_t images = 0;
  ASSIGN_OR_RETURN(auto trainer,
                   make_ddpm_client_trainer(c, source, static_cast<int>(partition), &images));
  *describe = fmt::format("partition {}: {} images of {} (only these loaded), DDPM U-Net",
                          partition, images, c.data().dataset());
  return trainer;
}

Result<std::unique_ptr<SimTask>> external_task(const v1::FederationConfig& c,
                                               std::string_view source, TaskUse) {
  return make_external_task(c, source);
}

Result<std::unique_ptr<edge_client::LocalTrainer>> external_client_trainer(
    const v1::FederationConfig&, std::string_view source, uint32_t, std::string*) {
  return invalid_argument(std::string(source) +
                          ": key 'client.trainer' must be \"exec\" when model.arch is EXTERNAL "
                          "(your program trains your model; docs/own_model.md)");
}

constexpr ModelKind kKinds[] = {
    {Arch::MLP, "mlp", make_mnist_task, make_mnist_client_trainer},
    {Arch::GPT, "gpt", make_text_task, make_text_client_trainer},
    {Arch::CNN, "cnn", make_mnist_task, make_mnist_client_trainer},
    {Arch::MDLM, "mdlm", make_text_task, make_text_client_trainer},
    {Arch::DDPM, "ddpm", make_ddpm_task, ddpm_client_trainer},
    {Arch::EXTERNAL, "external", external_task, external_client_trainer},
};

}  // namespace

std::span<const ModelKind> model_kinds() { return kKinds; }

Result<const ModelKind*> model_kind(const v1::FederationConfig& config, std::string_view source) {
  for (const ModelKind& k : kKinds) {
    if (k.arch == config.model().arch()) return &k;
  }
  return invalid_argument(fmt::format("{}: key 'model.arch' = {} has no registered model kind",
                                      source, static_cast<int>(config.model().arch())));
}

}  // namespace starling::sim
