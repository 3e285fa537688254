// A module's trainable parameters as the flat vector a federation moves: its layout (names,
// shapes, offsets), flattening, and loading a flat vector back. Frozen parameters (a LoRA
// model's base) are not part of it.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/io/safetensors.h"
#include "core/nn/module.h"
#include "core/util/status.h"

namespace starling::edge_client {

// Trainable parameters in named_parameters() order. REQUIRES: f32 parameters.
compress::Layout layout_of(const nn::Module& module);
std::vector<float> flatten(const nn::Module& module);
// Copies `flat` into the parameters. InvalidArgument when the size differs.
Status load_flat(nn::Module& module, std::span<const float> flat);

// Makes `device` ready for a trainer's model: nothing for the CPU; for a GPU the CUDA tensor
// backend (and the ops' CUDA forms) installed once, and the index checked against the GPUs
// visible. Errors name the device: a build without CUDA, no GPU, an index out of range.
Status prepare_device(Device device);

// A flat vector as named f32 tensors of `layout` (copies), e.g. for save_safetensors.
io::StateDict layout_tensors(const compress::Layout& layout, std::span<const float> flat);
// The layout's tensors out of `file` into `flat` (numel of the layout), float dtypes converted
// to f32. InvalidArgument naming `source` and the tensor for one that is missing, extra, of
// another shape, not a float, or (unless allow_non_finite) holding a NaN or infinity.
Status read_layout_tensors(const io::SafetensorsFile& file, const compress::Layout& layout,
                           std::span<float> flat, std::string_view source,
                           bool allow_non_finite = false);
// A layout of every tensor of `file` in file order (float tensors only), with their values.
Result<compress::Layout> layout_of_file(const io::SafetensorsFile& file, std::string_view source,
                                        std::vector<float>* values);

}  // namespace starling::edge_client
