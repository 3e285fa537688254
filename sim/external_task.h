// The user's own model (model.arch = EXTERNAL, docs/own_model.md): its tensors and initial
// values come from model.weights, each client's round goes to client.trainer_command through the
// exec protocol (edge_client/exec_trainer.h), and the aggregator evaluates with model.eval_command.
#pragma once

#include <memory>
#include <string_view>

#include "core/compress/codec.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "sim/task.h"

namespace starling::sim {

// REQUIRES: config validated, model.arch = EXTERNAL. Reads model.weights.
Result<std::unique_ptr<SimTask>> make_external_task(const v1::FederationConfig& config,
                                                    std::string_view source);

// Simulated clients of an EXTERNAL model run the exec trainer: InvalidArgument naming `source`
// and client.trainer otherwise (a C++ trainer simulates through starling::simulate_federation).
Status check_simulated_trainer(const v1::FederationConfig& config, std::string_view source);

// The aggregator evaluates an EXTERNAL model only through model.eval_command: InvalidArgument
// naming eval.every_rounds when it is asked to evaluate without one.
Status check_external_evaluation(const v1::FederationConfig& config, std::string_view source);

// The layout of the federation's model: EXTERNAL from model.weights (names and shapes only),
// the built-in kinds as their trainers lay them out. What an exec trainer's tensors must match.
Result<compress::Layout> federation_layout(const v1::FederationConfig& config,
                                           std::string_view source);

}  // namespace starling::sim
