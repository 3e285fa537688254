// The diffusion tasks of federations (model.arch MDLM and DDPM): a masked diffusion LM on Tiny
// Shakespeare split by speaking role, and a DDPM U-Net on an MNIST-style image partition.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/char_tokenizer.h"
#include "core/data/mnist.h"
#include "sim/task.h"

namespace starling::sim {

// The MDLM over the role split that make_shakespeare loaded: client k trains on
// train[bounds[k], bounds[k + 1]); `test` is every role's held-out tail. With [client] device
// "cuda" its trainers are the fused engine's (edge_client::FusedMdlmTrainer), each GPU checked
// unless `use` is kServer.
Result<std::unique_ptr<SimTask>> make_mdlm_task(
    const v1::FederationConfig& config, std::string_view source, data::CharTokenizer tok,
    std::shared_ptr<const std::vector<int32_t>> train, std::vector<int64_t> bounds,
    std::vector<int32_t> test, std::vector<std::string> names, int64_t minor, TaskUse use);

// The images of [data] fit [model.ddpm] image_size / image_channels (the error names `source`
// and the keys). An edge client checks its own examples with it before training.
Status check_ddpm_images(const v1::FederationConfig& config, std::string_view source,
                         const data::MnistSet& images);

// The DDPM trainer of edge client `partition`: the partition is computed from the labels alone
// and only its images are loaded (a device never holds the whole split as floats: 188 MB for
// MNIST). It trains exactly as make_ddpm_task(...)->make_trainer(partition). `images` receives
// the partition's image count.
Result<std::unique_ptr<edge_client::LocalTrainer>> make_ddpm_client_trainer(
    const v1::FederationConfig& config, std::string_view source, int partition, int64_t* images);

// Loads [data] (kSimulation: the train split, partitioned; the test split when [eval]
// every_rounds > 0) and checks the images fit [model.ddpm] image_size / image_channels (errors
// name `source` and key).
Result<std::unique_ptr<SimTask>> make_ddpm_task(const v1::FederationConfig& config,
                                                std::string_view source, TaskUse use);

}  // namespace starling::sim
