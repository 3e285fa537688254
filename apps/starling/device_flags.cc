// --device / --gpus onto [client] device / gpus.
#include "apps/starling/device_flags.h"

#include "aggregator/fed_task.h"

namespace starling::apps {

void add_device_flags(CLI::App* command, DeviceFlags* flags) {
  command->add_option("--device", flags->device,
                      "Where the built-in trainer runs: cpu or cuda (overrides [client] device)");
  command
      ->add_option("--gpus", flags->gpus,
                   "The GPU of --device cuda, e.g. --gpus 0 (overrides [client] gpus)")
      ->delimiter(',');
}

Status apply_device_flags(const DeviceFlags& flags, v1::FederationConfig* config,
                          std::string_view source) {
  if (flags.device.empty() && flags.gpus.empty()) return ok_status();
  if (!flags.device.empty()) config->mutable_client()->set_device(flags.device);
  if (!flags.gpus.empty()) {
    config->mutable_client()->clear_gpus();
    for (uint32_t g : flags.gpus) config->mutable_client()->add_gpus(g);
  }
  return aggregator::validate_federation_config(*config,
                                                std::string(source) + " with --device/--gpus");
}

}  // namespace starling::apps
