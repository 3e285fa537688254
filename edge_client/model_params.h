// A module's parameters as the flat vector a federation moves: its layout (names, shapes,
// offsets), flattening, and loading a flat vector back.
#pragma once

#include <span>
#include <vector>

#include "core/compress/codec.h"
#include "core/nn/module.h"
#include "core/util/status.h"

namespace starling::edge_client {

// Parameters in named_parameters() order. REQUIRES: f32 parameters.
compress::Layout layout_of(const nn::Module& module);
std::vector<float> flatten(const nn::Module& module);
// Copies `flat` into the parameters. InvalidArgument when the size differs.
Status load_flat(nn::Module& module, std::span<const float> flat);

}  // namespace starling::edge_client
