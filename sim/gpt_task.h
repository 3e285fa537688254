// The language models of federations (model.arch GPT and MDLM): Tiny Shakespeare split by
// speaking role, a char or GPT-2 BPE GPT (or the MDLM of sim/diffusion_task.h) per client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "sim/task.h"

namespace starling::sim {

// The GPT or MDLM task over the role split (every use loads the split: about 1 MB of text).
Result<std::unique_ptr<SimTask>> make_text_task(const v1::FederationConfig& config,
                                                std::string_view source, TaskUse use);

// Client `partition`'s trainer (its speaking role), or one over its own text ([data] path).
Result<std::unique_ptr<edge_client::LocalTrainer>> make_text_client_trainer(
    const v1::FederationConfig& config, std::string_view source, uint32_t partition,
    std::string* describe);

}  // namespace starling::sim
