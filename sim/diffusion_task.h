// The diffusion tasks of federations (model.arch MDLM and DDPM): a masked diffusion LM on Tiny
// Shakespeare split by speaking role, and a DDPM U-Net on an MNIST-style image partition.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/char_tokenizer.h"
#include "sim/task.h"

namespace starling::sim {

// The MDLM over the role split that make_shakespeare loaded: client k trains on
// train[bounds[k], bounds[k + 1]); `test` is every role's held-out tail.
Result<std::unique_ptr<SimTask>> make_mdlm_task(const v1::FederationConfig& config,
                                                std::string_view source, data::CharTokenizer tok,
                                                std::shared_ptr<const std::vector<int32_t>> train,
                                                std::vector<int64_t> bounds,
                                                std::vector<int32_t> test,
                                                std::vector<std::string> names, int64_t minor);

// Loads [data] (train split, and the test split when [eval] every_rounds > 0), partitions it and
// checks the images fit [model.ddpm] image_size / image_channels (errors name `source` and key).
Result<std::unique_ptr<SimTask>> make_ddpm_task(const v1::FederationConfig& config,
                                                std::string_view source);

}  // namespace starling::sim
