// SimTask's shared parts; each model kind's task lives in its own file (sim/model_kinds.cc).
#include "sim/task.h"

#include "aggregator/fed_task.h"
#include "sim/model_kind.h"

namespace starling::sim {

Result<std::unique_ptr<edge_client::LocalTrainer>> SimTask::make_local_trainer(
    const std::filesystem::path& path, std::string* describe) const {
  (void)describe;
  return invalid_argument("data.path " + path.string() + ": this task (" + this->describe() +
                          ") takes no local text; image classifiers read a folder of IDX files");
}

Result<std::unique_ptr<SimTask>> SimTask::create(const v1::FederationConfig& c,
                                                 std::string_view source, TaskUse use) {
  RETURN_IF_ERROR(aggregator::validate_federation_config(c, source));
  ASSIGN_OR_RETURN(const ModelKind* kind, model_kind(c, source));
  return kind->make_task(c, source, use);
}

}  // namespace starling::sim
