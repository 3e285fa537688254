// The model kinds of federations as gossip tasks (task.kind = "FEDERATED" in a gossip config):
// peers of `starling peer` and of gossip simulations train any model a federation trains, GPT
// with a pretrained base and LoRA adapters included, through the same SimTask.
#pragma once

#include "core/wire/federation.pb.h"
#include "core/wire/gossip.pb.h"

namespace starling::sim {

// The federation config a gossip config's [data], [model], [lora], [local] and [eval] describe
// (what SimTask::create reads).
v1::FederationConfig federation_of(const v1::GossipConfig& gossip);

// Installs the factory gossip::GossipTask uses for task.kind FEDERATED. Idempotent.
void register_gossip_model_tasks();

}  // namespace starling::sim
